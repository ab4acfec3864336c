"""Factored algebra against a dense float64 reference, and algebraic laws by hypothesis.

Tolerances: all factored quantities are computed in float64; against a dense float64 reference
they agree to rtol 1e-10 (a few hundred ulps of accumulated round-off on these shapes).
"""

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.testing import assert_close

from vecmerge.linalg.lowrank import LowRank, combine, rank_for_error

RTOL, ATOL = 1e-10, 1e-12


def rand_lr(out, inn, r, seed, scale=1.0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return LowRank(torch.randn(out, r, generator=g, dtype=dtype), torch.randn(r, inn, generator=g, dtype=dtype), scale)


shapes = st.tuples(st.integers(1, 12), st.integers(1, 12), st.integers(1, 5), st.integers(0, 10_000))


@settings(max_examples=40, deadline=None)
@given(shapes, st.floats(-3, 3, allow_nan=False), st.floats(-3, 3, allow_nan=False))
def test_linearity_and_inner_match_dense(sh, c1, c2):
    out, inn, r, seed = sh
    x, y = rand_lr(out, inn, r, seed, 0.5), rand_lr(out, inn, r + 1, seed + 1, 2.0)
    z = combine([(c1, x), (c2, y)])
    assert_close(z.dense(), c1 * x.dense() + c2 * y.dense(), rtol=RTOL, atol=ATOL)
    dense_inner = float((x.dense() * y.dense()).sum())
    assert math.isclose(x.inner(y), dense_inner, rel_tol=RTOL, abs_tol=1e-9)
    assert math.isclose(x.norm(), float(torch.linalg.norm(x.dense())), rel_tol=RTOL)
    assert math.isclose(x.norm() ** 2, x.inner(x), rel_tol=1e-9)


def test_near_cancelling_difference_keeps_its_digits():
    # v51 = v28 + tiny step: the Gram-sum ||x||^2 + ||y||^2 - 2<x,y> loses every digit, QR does not.
    x = rand_lr(64, 48, 8, 5)
    g = torch.Generator().manual_seed(9)
    eps = 1e-9
    y = LowRank(x.B + eps * torch.randn(64, 8, generator=g, dtype=torch.float64), x.A, x.scale)
    true = float(torch.linalg.norm(eps * torch.randn(64, 8, generator=torch.Generator().manual_seed(9),
                                                      dtype=torch.float64) @ x.A))
    diff = (y - x).norm()
    assert math.isclose(diff, true, rel_tol=1e-6)
    gram = x.norm() ** 2 + y.norm() ** 2 - 2 * x.inner(y)
    assert abs(math.sqrt(max(gram, 0.0)) - true) / true > 1e-3  # the naive way really is wrong here


@settings(max_examples=30, deadline=None)
@given(shapes)
def test_svd_matches_dense(sh):
    out, inn, r, seed = sh
    x = combine([(1.0, rand_lr(out, inn, r, seed)), (-0.3, rand_lr(out, inn, r, seed + 7))])
    s = x.svd()
    dense_s = torch.linalg.svdvals(x.dense())
    k = min(len(s.S), len(dense_s))
    assert_close(s.S[:k], dense_s[:k], rtol=1e-9, atol=1e-9 * float(dense_s[0]))
    assert_close(x.singular_values()[:k], dense_s[:k], rtol=1e-9, atol=1e-9 * float(dense_s[0]))


def test_x_minus_x_is_zero():
    x = rand_lr(10, 9, 3, 1)
    assert (x - x).norm() < 1e-12


def test_rank_for_error_edges():
    assert rank_for_error(torch.tensor([0.0, 0.0], dtype=torch.float64), 1e-9) == 0
    assert rank_for_error(torch.tensor([3.0, 1e-12], dtype=torch.float64), 1e-9) == 1
    assert rank_for_error(torch.tensor([3.0, 2.0, 1.0], dtype=torch.float64), 0.0) == 3




def test_energy_rank_reaches_the_share_inclusively():
    """Smallest k with sum_{i<k} S_i^2 >= E sum S_i^2 (within 1e-15): half of [1, 1] is reached by k = 1, also
    when E sits exactly 1e-15 above the share; a zero update has rank 0, a single value of energy 1 rank 1."""
    from vecmerge.linalg.lowrank import energy_rank

    S = torch.tensor([1.0, 1.0], dtype=torch.float64)
    assert energy_rank(S, 0.5) == 1 and energy_rank(S, 0.6) == 2 and energy_rank(S, 1.0) == 2
    e = 0.5 + 1e-15
    assert e - 1e-15 == 0.5 and energy_rank(S, e) == 1
    assert energy_rank(torch.zeros(3, dtype=torch.float64), 0.9) == 0
    assert energy_rank(torch.tensor([1.0], dtype=torch.float64), 0.5) == 1


def test_svd_exact_rank_measures_against_the_floor():
    """exact_rank: the smallest k whose dropped tail is at most rtol * max(||S||, floor); a large floor (the
    magnitude of the terms that cancelled) makes a small tail round-off."""
    from vecmerge.linalg.lowrank import SVD

    U, Vh = torch.eye(3, 2, dtype=torch.float64), torch.eye(2, 4, dtype=torch.float64)
    s = SVD(U, torch.tensor([1.0, 1e-7], dtype=torch.float64), Vh)
    assert s.exact_rank() == 2 and s.exact_rank(1e-6) == 1
    big = SVD(U, torch.tensor([1.0, 1e-7], dtype=torch.float64), Vh, floor=1e3)
    assert big.exact_rank() == 1 and big.exact_rank(1e-12) == 2
