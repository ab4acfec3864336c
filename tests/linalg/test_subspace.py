"""One shared basis per module: every term's core, sums, inner products and SVDs against dense float64.

Tolerance: rtol 1e-10 against dense float64 (QR round-off on these shapes).
"""

import math

import torch
from torch.testing import assert_close

from vecmerge.linalg.lowrank import LowRank
from vecmerge.linalg.subspace import Subspace


def rand_lr(out, inn, r, seed, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return LowRank(torch.randn(out, r, generator=g, dtype=torch.float64),
                   torch.randn(r, inn, generator=g, dtype=torch.float64), scale)


def lift(x):
    return x.space.left(x.C) @ x.space.bases()[1].T


def test_cores_equal_the_terms_and_their_algebra():
    terms = [rand_lr(40, 30, 4, 1, 0.5), rand_lr(40, 30, 3, 2, 2.0), rand_lr(40, 30, 2, 3, -1.0)]
    for keep in (True, False):
        space, cores = Subspace.of(terms, (40, 30), keep_bases=keep)
        assert (space.p, space.q) == (9, 9)
        for t, c in zip(terms, cores):
            assert_close(lift(c), t.dense(), rtol=1e-10, atol=1e-12)
        x, y = cores[0] - cores[1] * 0.3, cores[2]
        dx, dy = terms[0].dense() - 0.3 * terms[1].dense(), terms[2].dense()
        assert math.isclose(x.inner(y), float((dx * dy).sum()), rel_tol=1e-10)
        assert math.isclose(x.norm(), float(dx.norm()), rel_tol=1e-10)
        assert_close(x.singular_values(), torch.linalg.svdvals(dx)[:9], rtol=1e-10, atol=1e-12)
        s = x.svd()
        assert_close(s.U @ torch.diag(s.S) @ s.Vh, dx, rtol=1e-10, atol=1e-12)
        space.release()


def test_an_all_zero_module():
    space, cores = Subspace.of([LowRank.zeros((5, 4))], (5, 4))
    assert (space.p, space.q) == (0, 0) and cores[0].norm() == 0.0


def test_condition_bound_and_the_lift_it_guards():
    """condition_bound is an upper bound on kappa_2(R) within a factor m (against torch.linalg.cond), inf when
    R is singular; the implicit lift is taken below KAPPA_MAX, and both lifts give the same update (rtol 1e-10)."""
    from vecmerge.linalg.subspace import KAPPA_MAX, condition_bound

    g = torch.Generator().manual_seed(0)
    for m, spread in ((8, 1.0), (16, 1e3), (12, 1e7)):
        Q = torch.linalg.qr(torch.randn(50, m, generator=g, dtype=torch.float64)).Q
        R = torch.linalg.qr(Q * torch.logspace(0, math.log10(spread), m, dtype=torch.float64), mode="r").R
        kappa = float(torch.linalg.cond(R))
        assert kappa * (1 - 1e-9) <= condition_bound(R) <= m * kappa
    assert condition_bound(torch.triu(torch.ones(4, 4, dtype=torch.float64)) * torch.tensor([1.0, 1, 0, 1]))\
        == math.inf
    good = [rand_lr(40, 30, 4, 1), rand_lr(40, 30, 3, 2)]
    twin = [good[0], LowRank(good[0].B * (1 + 1e-12), good[0].A, 1.0)]  # collinear stacks: kappa ~ 1e12
    for terms, implicit in ((good, True), (twin, False)):
        space, cores = Subspace.of(terms, (40, 30))
        assert space.implicit() is implicit and (condition_bound(space._R[0]) <= KAPPA_MAX) is implicit
        assert_close(lift(cores[0]), terms[0].dense(), rtol=1e-10, atol=1e-12)
