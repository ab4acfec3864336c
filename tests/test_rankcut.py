"""The one rank cut against dense float64: exact reproduces, N is Eckart-Young, energy keeps its share.

Tolerances: the factored cut and a dense ``torch.linalg.svd`` of the same float64 update agree to
rtol 1e-9 (accumulated round-off of QR + small SVD against a dense SVD on these shapes). A dense update's
randomized cut reports its error exactly (rtol 1e-9 against the dense difference) and stays within 1% of the
optimal error (the randomized SVD's measured bound).
"""

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.testing import assert_close

from vecmerge.lowrank import LowRank, combine
from vecmerge.options import RankPolicy
from vecmerge.rankcut import cut
from vecmerge.subspace import Subspace

shapes = st.tuples(st.integers(1, 12), st.integers(1, 12), st.integers(1, 5), st.integers(0, 10_000))


def rand_lr(out, inn, r, seed, scale=1.0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return LowRank(torch.randn(out, r, generator=g, dtype=dtype), torch.randn(r, inn, generator=g, dtype=dtype), scale)


@settings(max_examples=30, deadline=None)
@given(shapes)
def test_exact_cut_reproduces_the_update(sh):
    out, inn, r, seed = sh
    x = combine([(1.0, rand_lr(out, inn, r, seed)), (-0.3, rand_lr(out, inn, r, seed + 7))])
    dense_s = torch.linalg.svdvals(x.dense())
    rf = cut(x, RankPolicy.parse("exact"))
    assert_close(rf.factors.dense(), x.dense(), rtol=1e-9, atol=1e-9 * float(dense_s[0]))
    assert rf.rank == min(out, inn, 2 * r)  # generic factors: full numerical rank


def test_rank_cut_error_is_eckart_young():
    x = rand_lr(20, 15, 8, 3)
    dense = x.dense()
    U, S, Vh = torch.linalg.svd(dense)
    for k in (1, 3, 5, 7):
        rf = cut(x, RankPolicy.parse(str(k)))
        best = U[:, :k] @ torch.diag(S[:k]) @ Vh[:k]
        assert_close(rf.factors.dense(), best, rtol=1e-9, atol=1e-10)
        err = float(torch.linalg.norm(rf.factors.dense() - dense))
        assert math.isclose(rf.error, err, rel_tol=1e-9)
        assert math.isclose(rf.error, float(torch.sqrt((S[k:] ** 2).sum())), rel_tol=1e-9)


def test_energy_policy_keeps_the_share():
    x = rand_lr(30, 25, 10, 4)
    S = torch.linalg.svdvals(x.dense())
    rf = cut(x, RankPolicy.parse("energy:0.9"))
    kept = float((S[: rf.rank] ** 2).sum() / (S**2).sum())
    assert kept >= 0.9
    assert float((S[: rf.rank - 1] ** 2).sum() / (S**2).sum()) < 0.9


def test_x_minus_x_has_rank_zero():
    x = rand_lr(10, 9, 3, 1)
    z = x - x
    assert z.norm() < 1e-12
    assert cut(z, RankPolicy.parse("exact")).rank == 0




def test_cut_of_a_core_equals_cut_of_its_factors():
    """The pipeline cuts cores in a module's shared basis; refactor/verify cut LowRanks: one rule, same result."""
    a, b = rand_lr(30, 20, 4, 1, 0.5), rand_lr(30, 20, 3, 2, 2.0)
    _, (ca, cb) = Subspace.of([a, b], (30, 20))
    target = ca + cb * -0.7
    direct = combine([(1.0, a), (-0.7, b)])
    for policy in ("exact", "3", "energy:0.8"):
        x, y = cut(target, RankPolicy.parse(policy)), cut(direct, RankPolicy.parse(policy))
        assert (x.rank, x.exact_rank) == (y.rank, y.exact_rank), policy
        assert math.isclose(x.error, y.error, rel_tol=1e-9, abs_tol=1e-12)
        assert math.isclose(x.norm, y.norm, rel_tol=1e-12)
        assert_close(x.factors.dense(), y.factors.dense(), rtol=1e-9, atol=1e-12)
        dense = direct.dense()
        assert math.isclose(x.error, float(torch.linalg.norm(x.factors.dense() - dense)), rel_tol=1e-7, abs_tol=1e-12)


def lowrank_plus_noise(rows, cols, r, noise, seed):
    g = torch.Generator().manual_seed(seed)
    D = torch.randn(rows, r, generator=g, dtype=torch.float64) @ torch.randn(r, cols, generator=g, dtype=torch.float64)
    return D + noise * torch.randn(rows, cols, generator=g, dtype=torch.float64)


def test_dense_cuts_report_their_exact_error():
    """Dense updates (the dense-space merges): the randomized cut's error equals ``||D - cut||`` to rtol 1e-9 and is
    within 1% of Eckart-Young's; N above min(out, in)/8 gets a third power iteration; energy and exact as for cores."""
    from vecmerge.dense import Dense

    for (rows, cols), k, iters in (((300, 200), 8, 2), ((600, 400), 60, 3)):
        D = lowrank_plus_noise(rows, cols, 12, 0.3, 1)
        S = torch.linalg.svdvals(D)
        c = cut(Dense(D), RankPolicy.parse(str(k)), seed=5)
        assert (c.method, c.power_iters, c.rank, c.exact_rank) == ("randomized", iters, k, None)
        direct = float(torch.linalg.norm(D - c.factors.dense()))
        assert math.isclose(c.error, direct, rel_tol=1e-9)
        assert c.error <= 1.01 * float(torch.sqrt((S[k:] ** 2).sum()))
        assert math.isclose(c.norm, float(torch.linalg.norm(D)), rel_tol=1e-12)
    D = lowrank_plus_noise(300, 200, 12, 0.3, 1)
    S = torch.linalg.svdvals(D)
    e = cut(Dense(D), RankPolicy.parse("energy:0.9"))
    kept = float(torch.linalg.norm(e.factors.dense())) ** 2
    assert kept >= (0.9 - 1e-9) * float(torch.linalg.norm(D)) ** 2
    assert e.rank <= int((torch.cumsum(S**2, 0) < 0.9 * (S**2).sum()).sum()) + 2  # nearly the minimal rank
    x = cut(Dense(D), RankPolicy.parse("exact"))
    assert (x.method, x.rank, x.exact_rank) == ("full", 200, 200)
    assert_close(x.factors.dense(), D, rtol=1e-12, atol=1e-12)
    low = lowrank_plus_noise(300, 200, 5, 0.0, 2)  # rank 5: a rank-8 cut keeps 5 and drops only round-off
    c = cut(Dense(low), RankPolicy.parse("8"))
    assert c.rank == 5 and c.error <= 1e-9 * float(torch.linalg.norm(low))
