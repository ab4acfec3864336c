"""The one rank cut against dense float64: exact reproduces, N is Eckart-Young, energy keeps its share.

Tolerances: the factored cut and a dense ``torch.linalg.svd`` of the same float64 update agree to
rtol 1e-9 (accumulated round-off of QR + small SVD against a dense SVD on these shapes). A dense update's
randomized cut reports its error exactly (rtol 1e-9 against the dense difference) and stays within 1% of the
optimal error (the randomized SVD's measured bound).
"""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.testing import assert_close

from vecmerge.linalg.lowrank import LowRank, combine
from vecmerge.linalg.rank_policy import RankPolicy
from vecmerge.linalg.rankcut import cut
from vecmerge.linalg.subspace import Subspace

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


def test_common_rank_pads_with_zero_directions():
    """rank=k keeps min(k, exact) directions (Eckart-Young error) and pads with zeros: the update is unchanged."""
    x = rand_lr(9, 7, 2, 5)
    dense = x.dense()
    S = torch.linalg.svdvals(dense)
    c = cut(x, RankPolicy("fixed", 1), rank=4)  # a common rank above the exact rank 2
    assert c.rank == 4 and c.factors.rank == 4 and c.exact_rank == 2
    assert bool((c.factors.B[:, 2:] == 0).all()) and bool((c.factors.A[2:] == 0).all())
    assert_close(c.factors.dense(), dense, rtol=1e-9, atol=1e-12)
    c = cut(x, RankPolicy("energy", 0.1), rank=1)
    assert c.rank == 1 and math.isclose(c.error, float(S[1]), rel_tol=1e-9)
    space, (core,) = Subspace.of([x], x.shape)
    c = cut(core, RankPolicy("exact"), rank=3)
    assert c.rank == 3 and bool((c.factors.A[2:] == 0).all())
    assert_close(c.factors.dense(), dense, rtol=1e-9, atol=1e-12)


def test_a_common_rank_on_a_core_keeps_what_its_factors_keep():
    """rank=k on a core (the pipeline's path for the experts of one MoE parameter) keeps min(k, exact) directions
    whatever the policy chose, as on its factors: below the policy's rank it cuts further, above it keeps up to the
    exact rank; then pads to k. The kept part is the best rank-min(k, exact) approximation (dense SVD, rtol 1e-9),
    the error its Eckart-Young tail. A dense update and keep-base pad to k as well (zero directions, same update)."""
    from vecmerge.linalg.dense import Dense

    a, b = rand_lr(14, 11, 3, 31, scale=2.0), rand_lr(14, 11, 2, 32)
    _, (ca, cb) = Subspace.of([a, b], (14, 11))
    core, direct = ca + cb * 0.5, combine([(1.0, a), (0.5, b)])  # exact rank 5
    dense = direct.dense()
    U, S, Vh = torch.linalg.svd(dense)
    for policy, rank, kept in (("exact", 3, 3), ("1", 4, 4), ("1", 7, 5), ("energy:0.1", 2, 2)):
        c, d = cut(core, RankPolicy.parse(policy), rank=rank), cut(direct, RankPolicy.parse(policy), rank=rank)
        assert (c.rank, c.factors.rank, c.exact_rank) == (rank, rank, 5), (policy, rank)
        best = U[:, :kept] @ torch.diag(S[:kept]) @ Vh[:kept]
        assert_close(c.factors.dense(), best, rtol=1e-9, atol=1e-9 * float(S[0]))
        assert_close(d.factors.dense(), best, rtol=1e-9, atol=1e-9 * float(S[0]))
        assert math.isclose(c.error, float(torch.sqrt((S[kept:] ** 2).sum())), rel_tol=1e-9, abs_tol=1e-12)
    c = cut(Dense(dense), RankPolicy.parse("3"), rank=6)
    assert (c.rank, c.factors.rank) == (6, 6) and bool((c.factors.B[:, 3:] == 0).all())
    assert_close(c.factors.dense(), U[:, :3] @ torch.diag(S[:3]) @ Vh[:3],
                 rtol=1e-9, atol=1e-9 * float(S[0]))
    k = cut(core, RankPolicy("keep-base"), backbone=a, step=cb * 0.5, rank=8)
    assert (k.rank, k.factors.rank) == (8, 8) and bool((k.factors.A[5:] == 0).all())
    assert_close(k.factors.dense(), dense, rtol=0, atol=1e-12 * float(dense.abs().max()))


def test_a_padded_cut_measures_its_rounding_through_its_cores():
    """The pipeline measures the output dtype's rounding E = W - R through the cut's cores (``figures.rounding``); for
    a cut padded to a common rank (a core cut of the basis's full rank 5, one of rank 3 in that basis, and keep-base)
    ||E|| equals the dense difference of the bf16-rounded factors and the cut (rtol 1e-6: the terms are of the
    rounding's order), and the core of E equals the one the general route computes without cores (atol 1e-12 of
    ||E||)."""
    from vecmerge.pipeline.figures import rounding

    a, b = rand_lr(14, 11, 3, 41, scale=2.0), rand_lr(14, 11, 2, 42)
    space, (ca, cb) = Subspace.of([a, b], (14, 11))
    cuts = (cut(ca + cb, RankPolicy.parse("exact"), rank=8), cut(ca, RankPolicy.parse("2"), rank=6),
            cut(ca + cb, RankPolicy("keep-base"), backbone=a, step=cb, rank=8))
    for c in cuts:
        W = LowRank(c.factors.B.to(torch.bfloat16).double(), c.factors.A.to(torch.bfloat16).double(), c.factors.scale)
        e, core = rounding(W, c.factors, space, c.cores)
        want = float(torch.linalg.norm(W.dense() - c.factors.dense()))
        assert want > 0 and math.isclose(e, want, rel_tol=1e-6)
        _, general = rounding(W, c.factors, space, None)
        assert_close(core, general, rtol=0, atol=1e-12 * want)


def _dense_step_energy_rank(dense, step_norm, e):
    """Smallest k with sum_{i>=k} S_i^2 <= (1 - e) ||step||^2, from a dense SVD."""
    s2 = torch.linalg.svdvals(dense) ** 2
    tails = [float(s2[k:].sum()) for k in range(len(s2) + 1)]
    return next(k for k, t in enumerate(tails) if t <= (1 - e) * step_norm**2)


def test_step_energy_keeps_the_step_where_energy_cuts_it():
    """Issue 12 item 14: a small step on a large backbone; energy:E measures the whole update and may drop the
    step, step-energy:E bounds the cut's loss by (1 - E) ||step||^2 (ranks and errors against a dense SVD)."""
    base = rand_lr(24, 20, 6, 11, scale=10.0)
    step = rand_lr(24, 20, 3, 12, scale=0.05)
    x = combine([(1.0, base), (1.0, step)])
    dense, sn = x.dense(), float(torch.linalg.norm(step.dense()))
    for e in (0.9, 0.99, 0.999):
        c = cut(x, RankPolicy.parse(f"step-energy:{e}"), step=step)
        assert c.rank == _dense_step_energy_rank(dense, sn, e)
        assert c.error**2 <= (1 - e) * sn**2 * (1 + 1e-9)
        assert_close(torch.tensor(float(torch.linalg.norm(c.factors.dense() - dense))), torch.tensor(c.error),
                     rtol=1e-6, atol=1e-12 * float(torch.linalg.norm(dense)))
    whole = cut(x, RankPolicy.parse("energy:0.999"))
    assert whole.error**2 > (1 - 0.999) * sn**2  # the whole-update measure loses more of the step than 0.1%
    _, (b_core, s_core) = Subspace.of([base, step], (24, 20))  # the pipeline's path: cores of one basis
    c = cut(b_core + s_core, RankPolicy.parse("step-energy:0.999"), step=s_core)
    assert c.rank == _dense_step_energy_rank(dense, sn, 0.999)
    assert_close(c.factors.dense(), cut(x, RankPolicy.parse("step-energy:0.999"), step=step).factors.dense(),
                 rtol=1e-9, atol=1e-9 * float(torch.linalg.norm(dense)))
    assert str(RankPolicy.parse("step-energy:0.999")) == "step-energy:0.999"
def lowrank_plus_noise(rows, cols, r, noise, seed):
    g = torch.Generator().manual_seed(seed)
    D = torch.randn(rows, r, generator=g, dtype=torch.float64) @ torch.randn(r, cols, generator=g, dtype=torch.float64)
    return D + noise * torch.randn(rows, cols, generator=g, dtype=torch.float64)


def test_dense_cuts_report_their_exact_error():
    """Dense updates (the dense-space merges): the randomized cut's error equals ``||D - cut||`` to rtol 1e-9 and is
    within 1% of Eckart-Young's; N above min(out, in)/8 gets a third power iteration; energy and exact as for cores."""
    from vecmerge.linalg.dense import Dense

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


def spectral(rows, cols, S, seed):
    """``U diag(S) V^T`` with random orthonormal U (rows, k), V (cols, k): a dense matrix of known spectrum."""
    g = torch.Generator().manual_seed(seed)
    S = torch.as_tensor(S, dtype=torch.float64)
    U, _ = torch.linalg.qr(torch.randn(rows, len(S), generator=g, dtype=torch.float64))
    V, _ = torch.linalg.qr(torch.randn(cols, len(S), generator=g, dtype=torch.float64))
    return (U * S) @ V.T


def test_dense_exact_cut_reports_its_error_norm_and_rank():
    """``exact`` on a dense update: rank 4 of a rank-4 matrix plus a 1e-12 tail, error = the dropped tail's norm
    (against a dense SVD, rtol 1e-6: the tail is 1e-12 of ||D||) and norm = ||D|| (rtol 1e-12)."""
    from vecmerge.linalg.dense import Dense

    D = spectral(40, 30, [3.0, 2.0, 1.0, 0.5] + [1e-12] * 6, 1)
    S = torch.linalg.svdvals(D)
    c = cut(Dense(D), RankPolicy.parse("exact"))
    assert (c.method, c.rank, c.exact_rank, c.factors.rank, c.power_iters) == ("full", 4, 4, 4, None)
    assert math.isclose(c.error, float(torch.sqrt((S[4:] ** 2).sum())), rel_tol=1e-6)
    assert math.isclose(c.norm, float(torch.linalg.norm(D)), rel_tol=1e-12)
    assert_close(c.factors.dense(), D, rtol=0, atol=1e-11)


def test_dense_randomized_cut_is_seeded_and_its_power_iterations_follow_the_rule():
    """N exceeding min(out, in)/8 gets a third power iteration (N = 25 of 200 does not, 26 does); the seed fixes
    the test matrix (the same seed: the same bits; another: other bits); a small matrix takes the full SVD,
    which has no power iterations."""
    from vecmerge.linalg.dense import Dense

    D = lowrank_plus_noise(300, 200, 12, 0.3, 1)
    assert cut(Dense(D), RankPolicy.parse("25"), seed=1).power_iters == 2
    assert cut(Dense(D), RankPolicy.parse("26"), seed=1).power_iters == 3
    for policy in ("8", "energy:0.5"):
        a, b = cut(Dense(D), RankPolicy.parse(policy), seed=5), cut(Dense(D), RankPolicy.parse(policy), seed=5)
        c = cut(Dense(D), RankPolicy.parse(policy), seed=6)
        assert a.method == "randomized" and a.power_iters == 2
        assert torch.equal(a.factors.B, b.factors.B) and torch.equal(a.factors.A, b.factors.A)
        assert not torch.equal(a.factors.B, c.factors.B)
    small = cut(Dense(lowrank_plus_noise(12, 10, 3, 0.1, 2)), RankPolicy.parse("2"))
    assert (small.method, small.power_iters, small.rank) == ("full", None, 2)


@pytest.mark.parametrize("S, k, want", [
    ([1.0, 1e-8], 2, 2),                        # 1e-16 of ||D||^2 is rank (above EXACT_RTOL^2 = 1e-18)
    ([1.0, 1e-10], 2, 1),                       # 1e-20 of it is round-off
    ([1.0, 7e-10, 7e-10, 7e-10], 4, 2),         # the tails add up: two of the three fit under 1e-18
    ([1.0, 9e-10, 1e-10, 1e-10], 4, 1),         # 1e-20 + 1e-20 + 8.1e-19 still fits
    ([0.0, 0.0], 2, 0),                         # a zero update has rank 0
])
@pytest.mark.parametrize("size", [1e-6, 1.0, 1e6])
def test_dense_cuts_drop_round_off_directions(S, k, want, size):
    """Trailing singular values whose squares add up to at most EXACT_RTOL^2 ||D||^2 are not rank (the designed
    spectra give the rank by hand), at any size of D; the error stays the whole dropped tail (rtol 1e-6)."""
    from vecmerge.linalg.dense import Dense

    D = spectral(30, 20, [s * size for s in S], 3)
    c = cut(Dense(D), RankPolicy.parse(str(k)))
    assert c.rank == want and c.factors.rank == want
    tail = math.sqrt(sum(s * s for s in S[want:])) * size
    assert math.isclose(c.error, tail, rel_tol=1e-6, abs_tol=1e-15 * size)
    assert_close(c.factors.dense(), D, rtol=0, atol=1e-9 * size)


def test_low_rank_dense_cut_drops_only_round_off_at_any_size():
    """A rank-5 dense update cut at 8 keeps 5 whatever its size: the round-off directions' energy is measured
    against ||D||^2, not in absolute terms; the written factors have the cut's rank."""
    from vecmerge.linalg.dense import Dense

    low = lowrank_plus_noise(300, 200, 5, 0.0, 2)
    for size in (1e-6, 1e6):
        c = cut(Dense(low * size), RankPolicy.parse("8"))
        assert c.rank == 5 and c.factors.rank == 5
        assert c.error <= 1e-9 * float(torch.linalg.norm(low * size))


def test_keep_base_appends_the_step_to_the_backbone():
    """keep-base: the backbone's factors bit for bit (its scale too), then the step's exact-rank factors divided by
    that scale; rank = backbone rank + step rank, error = the step's dropped round-off, norm = ||target||; without a
    backbone the factors are the step's own (scale 1); a backbone module of scale 0 (lora_alpha 0) has no update to
    keep: the step alone is written (before the fix its factors were kept under scale 1, adding B0 A0 to the update).
    Tolerances: float64 round-off of the factored products, 1e-12 of the largest entry."""
    base = rand_lr(12, 9, 3, 21, scale=2.5)
    step = rand_lr(12, 9, 2, 22, scale=0.1)
    _, (b_core, s_core) = Subspace.of([base, step], (12, 9))
    target = b_core + s_core
    dense = base.dense() + step.dense()
    c = cut(target, RankPolicy("keep-base"), backbone=base, step=s_core)
    assert torch.equal(c.factors.B[:, :3], base.B) and torch.equal(c.factors.A[:3], base.A)
    assert c.factors.scale == 2.5 and (c.rank, c.exact_rank, c.factors.rank) == (5, 5, 5)
    assert_close(c.factors.dense(), dense, rtol=0, atol=1e-12 * float(dense.abs().max()))
    assert c.error <= 1e-12 * step.norm() and math.isclose(c.norm, float(torch.linalg.norm(dense)), rel_tol=1e-12)
    alone = cut(s_core, RankPolicy("keep-base"), backbone=None, step=s_core)
    assert (alone.rank, alone.factors.scale) == (2, 1.0)
    assert_close(alone.factors.dense(), step.dense(), rtol=0, atol=1e-12 * float(step.dense().abs().max()))
    silent = LowRank(base.B, base.A, 0.0)  # lora_alpha 0: the backbone's update is zero
    _, (z_core, s2) = Subspace.of([silent, step], (12, 9))
    c0 = cut(z_core + s2, RankPolicy("keep-base"), backbone=silent, step=s2)
    assert (c0.factors.scale, c0.rank) == (1.0, 2)
    assert_close(c0.factors.dense(), silent.dense() + step.dense(), rtol=0, atol=1e-12 * float(dense.abs().max()))


def test_pad_adds_exactly_the_zero_directions_asked_for():
    """pad(x, r) has rank r (one more included), the same scale and the same update; never fewer than x's rank."""
    from vecmerge.linalg.rankcut import pad

    x = rand_lr(6, 5, 2, 9, scale=3.0)
    for r in (1, 2, 3, 5):
        p = pad(x, r)
        assert p.rank == max(r, 2) and p.scale == 3.0
        assert_close(p.dense(), x.dense(), rtol=0, atol=0)


def test_one_rank_k_cut_for_dense_updates_and_extract():
    """The rank cut's N on a dense update and extract's N on a fine-tune's difference run the one rank-k cut
    (``randsvd.rank_k_cut``): the same power-iteration rule (2 up to rank min(out, in)/8, 3 above) and, on the
    full-SVD path, the same cut to rtol 1e-12."""
    from vecmerge.linalg.dense import Dense
    from vecmerge.linalg.dense_cut import cut_module
    from vecmerge.linalg.randsvd import power_iters_for

    D = lowrank_plus_noise(600, 400, 12, 0.3, 1)
    for k in (8, 50, 51):
        merged = cut(Dense(D), RankPolicy.parse(str(k)), seed=5)
        extracted = cut_module(D, RankPolicy.parse_extract(str(k)), seed=5)
        assert merged.power_iters == extracted.power_iters == power_iters_for(k, 600, 400) == (2 if k <= 50 else 3)
    small = lowrank_plus_noise(60, 40, 12, 0.3, 1)
    merged, extracted = cut(Dense(small), RankPolicy.parse("8")), cut_module(small, RankPolicy.parse_extract("8"))
    assert (merged.method, extracted.svd.method, merged.power_iters, extracted.power_iters) == ("full", "full", None, 0)
    assert math.isclose(merged.error, extracted.svd.error, rel_tol=1e-12)
