"""Merge kernels against PEFT 0.21's own ``merge_utils`` functions, hand computations and DARE's statistics.

PEFT's functions run on the same dense inputs. The deterministic kernels perform PEFT's operations in
PEFT's order, so they are compared with ``torch.equal`` (bit for bit), in float64 and float32. DARE
draws from a ``torch.Generator``; seeded like PEFT's global generator its masks are bit-identical, so
it is compared exactly too, and its statistics are checked on their own (Monte Carlo bounds below).
The counting edges (densities keeping 0 or 1 entry per task), bfloat16 tasks and the dtype of DARE's draws
are compared exactly as well; SLERP's coefficients with the formula to rtol 1e-12.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch.testing import assert_close

from vecmerge.linalg.lowrank import LowRank, combine
from vecmerge.linalg.merge_kernels import (
    MergeArgumentError,
    dare_drop,
    dare_linear,
    dare_ties,
    magnitude_mask,
    magnitude_prune,
    majority_sign_mask,
    module_seed,
    slerp_coefficients,
    ties,
)


def stack(seed: int, n=3, rows=24, cols=17, dtype=torch.float64) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, rows, cols, generator=g, dtype=dtype)


WEIGHTS = [0.7, -0.4, 1.3]


# -- magnitude pruning and TIES: bit-identical to PEFT -------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("density", [0.1, 0.29, 0.5, 0.9, 1.0])
def test_magnitude_prune_and_ties_equal_peft(peft_mu, dtype, density):
    X = stack(11, dtype=dtype)
    w = torch.tensor(WEIGHTS, dtype=dtype)
    with pytest.warns(UserWarning) if density >= 1 else _nullcontext():  # PEFT warns at density 1
        ref_mp = peft_mu.magnitude_prune(list(X), w, density)
    assert torch.equal(magnitude_prune(X, w, density), ref_mp)
    for majority in ("total", "frequency"):
        with pytest.warns(UserWarning) if density >= 1 else _nullcontext():
            ref = peft_mu.ties(list(X), w, density, majority)
        assert torch.equal(ties(X, w, density, majority), ref)


def _nullcontext():
    import contextlib

    return contextlib.nullcontext()


def test_python_weights_are_exact_in_float64(peft_mu):
    """Weights given as Python floats become float64 exactly (PEFT's add_weighted_adapter rounds them to float32)."""
    X = stack(3)
    assert torch.equal(magnitude_prune(X, WEIGHTS, 0.5),
                       peft_mu.magnitude_prune(list(X), torch.tensor(WEIGHTS, dtype=torch.float64), 0.5))


def test_magnitude_mask_ties_and_count_by_hand():
    """|x| = 3, 1, 1, 1, 2 at density 0.6 keeps k = int(0.6*5) = 3: the 3, the 2 and the first 1 (index 1)."""
    x = torch.tensor([3.0, -1.0, 1.0, 1.0, 2.0])
    assert magnitude_mask(x, 0.6).tolist() == [True, True, False, False, True]
    # PEFT's count: int(0.29 * 100) = int(28.999999999999996) = 28
    assert int(magnitude_mask(torch.arange(1.0, 101.0), 0.29).sum()) == 28
    assert int(magnitude_mask(torch.ones(10, 10), 0.5).sum()) == 50  # all tied: the first 50 flat entries
    assert magnitude_mask(torch.ones(10, 10), 0.5).reshape(-1)[:50].all()


def test_ties_by_hand():
    """Two tasks, weights (1, 2), density 2/3 (k = int(2/3 * 3) = 2 of 3 entries per task).

    X1 = [3, -1, 2] -> trimmed [3, 0, 2];  X2 = [-1, -4, 1.5] -> trimmed [0, -4, 1.5].
    Election on the unweighted sum [3, -4, 3.5]: signs [+, -, +].
    Agreeing weighted entries: col 0: 1*3 (count 1) -> 3; col 1: 2*(-4) (count 1) -> -8;
    col 2: (1*2 + 2*1.5) / 2 = 2.5.  magnitude_prune: 1*[3, 0, 2] + 2*[0, -4, 1.5] = [3, -8, 5].
    With X2 = [-1, -4, 1] the magnitudes 1 and 1 tie at the threshold and the lower index (the -1) is
    kept: trimmed [-1, -4, 0], magnitude_prune = [3 - 2, -8, 2] = [1, -8, 2].
    """
    X = torch.tensor([[[3.0, -1.0, 2.0]], [[-1.0, -4.0, 1.5]]], dtype=torch.float64)
    assert ties(X, [1.0, 2.0], 2 / 3).tolist() == [[3.0, -8.0, 2.5]]
    assert magnitude_prune(X, [1.0, 2.0], 2 / 3).tolist() == [[3.0, -8.0, 5.0]]
    X[1, 0, 2] = 1.0
    assert magnitude_prune(X, [1.0, 2.0], 2 / 3).tolist() == [[1.0, -8.0, 2.0]]
    # A zero vote elects +1: signs +1 and -1 count 0 under "frequency"; the sum 2 - 5 = -3 under "total".
    Y = torch.tensor([[[2.0]], [[-5.0]]], dtype=torch.float64)
    assert ties(Y, [1.0, 1.0], 1.0, "frequency").tolist() == [[2.0]]  # only task 1 agrees with +
    assert ties(Y, [1.0, 1.0], 1.0, "total").tolist() == [[-5.0]]  # only task 2 agrees with -


def peft_per_task(mu, X: torch.Tensor, w, densities: list, majority=None) -> torch.Tensor:
    """PEFT's magnitude pruning task by task (its ``prune``), then its weighted sum or its TIES election and
    disjoint merge: the definitions of ``merge_utils`` with one density per task."""
    T = torch.stack([mu.prune(x, d, "magnitude") for x, d in zip(X, densities)])
    weighted = T * torch.as_tensor(w, dtype=X.dtype).view(-1, 1, 1)
    if majority is None:
        return weighted.sum(0)
    return mu.disjoint_merge(weighted, mu.calculate_majority_sign_mask(T, majority))


def test_densities_that_keep_no_entry_or_one_equal_peft(peft_mu):
    """Per-task densities at the counting edges: of 408 entries, 0.002 keeps int(0.816) = 0 (the task drops out),
    0.003 keeps int(1.224) = 1 (its largest |x|), 0.5 keeps 204; PEFT's per-task ``prune`` is the reference."""
    X, dens = stack(21), [0.002, 0.003, 0.5]
    for d, x in zip(dens, X):
        m = magnitude_mask(x, d)
        assert m.dtype == torch.bool and m.shape == x.shape and int(m.sum()) == int(d * x.numel())
    assert not magnitude_mask(X[0], 0.002).any()
    assert magnitude_mask(X[1], 0.003).reshape(-1).nonzero().flatten().tolist() == [int(X[1].abs().argmax())]
    assert torch.equal(magnitude_prune(X, WEIGHTS, dens), peft_per_task(peft_mu, X, WEIGHTS, dens))
    for majority in ("total", "frequency"):
        assert torch.equal(ties(X, WEIGHTS, dens, majority), peft_per_task(peft_mu, X, WEIGHTS, dens, majority))


def test_bfloat16_tasks_are_pruned_as_peft_does(peft_mu):
    """bfloat16 (which numpy cannot hold) takes torch's own selection; magnitudes are distinct integers up to 120
    (exact in bfloat16), so the kept entries are unambiguous and PEFT's ``topk`` keeps the same ones."""
    g = torch.Generator().manual_seed(4)
    mags = torch.stack([torch.randperm(120, generator=g) + 1 for _ in range(3)]).reshape(3, 10, 12)
    signs = torch.where(torch.rand(3, 10, 12, generator=g) < 0.5, -1, 1)
    X = (mags * signs).to(torch.bfloat16)
    w = torch.tensor([0.5, -0.25, 1.0], dtype=torch.bfloat16)
    for density in (0.1, 0.45):
        got = magnitude_prune(X, w, density)
        assert got.dtype == torch.bfloat16 and torch.equal(got, peft_mu.magnitude_prune(list(X), w, density))
        assert torch.equal(ties(X, w, density), peft_mu.ties(list(X), w, density, "total"))


def test_majority_sign_mask_defaults_to_the_papers_total_vote(peft_mu):
    """The default election is the sign of the summed values (TIES' rule, PEFT's default), not of the sign count:
    on tasks where the two differ (one large positive against two small negatives) it follows the sum."""
    T = torch.tensor([[[5.0, -1.0]], [[-1.0, -1.0]], [[-1.0, 2.0]]], dtype=torch.float64)
    got = majority_sign_mask(T)
    assert torch.equal(got, peft_mu.calculate_majority_sign_mask(T))
    assert not torch.equal(got, majority_sign_mask(T, "frequency"))
    assert got[:, 0, 0].tolist() == [True, False, False]  # 5 - 1 - 1 = 3 > 0 elects +, though two of three are -


# -- DARE: PEFT's random stream reproduced exactly -------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_dare_equals_peft_with_the_same_seed(peft_mu, dtype):
    X = stack(5, dtype=dtype)
    w = torch.tensor(WEIGHTS, dtype=dtype)
    for density in (0.3, 0.75):
        torch.manual_seed(1234)
        ref_lin = peft_mu.dare_linear(list(X), w, density)
        ref_ties = peft_mu.dare_ties(list(X), w, density, "total")  # continues PEFT's global stream
        ref_freq = peft_mu.dare_ties(list(X), w, density, "frequency")
        g = torch.Generator().manual_seed(1234)
        assert torch.equal(dare_linear(X, w, density, g), ref_lin)
        assert torch.equal(dare_ties(X, w, density, g, "total"), ref_ties)
        assert torch.equal(dare_ties(X, w, density, g, "frequency"), ref_freq)


def test_dare_density_one_draws_nothing():
    g = torch.Generator().manual_seed(9)
    before = g.get_state()
    X = stack(1)
    w = torch.tensor(WEIGHTS, dtype=torch.float64)
    assert torch.equal(dare_linear(X, WEIGHTS, 1.0, g), (X * w[:, None, None]).sum(0))
    assert torch.equal(g.get_state(), before)


def test_every_kernel_returns_the_tasks_dtype_whatever_the_draws_dtype():
    """float32 tasks with float64 Bernoulli draws (and float64 tasks with float32 draws, the pipeline's choice):
    the result is in X's dtype and equals the DARE definition written out, ``x * mask / d`` with the mask
    drawn in the draws' dtype and cast to X's, bit for bit."""
    for dtype, mask_dtype in ((torch.float32, torch.float64), (torch.float64, torch.float32)):
        X, d = stack(6, dtype=dtype), 0.4
        w = torch.tensor(WEIGHTS, dtype=dtype)
        g = torch.Generator().manual_seed(5)
        T = torch.stack([x * torch.bernoulli(torch.full(x.shape, d, dtype=mask_dtype), generator=g).to(dtype) / d
                         for x in X])
        got = dare_linear(X, w, d, torch.Generator().manual_seed(5), mask_dtype=mask_dtype)
        assert got.dtype == dtype and torch.equal(got, (T * w.view(-1, 1, 1)).sum(0))
        assert dare_ties(X, w, d, torch.Generator().manual_seed(5), mask_dtype=mask_dtype).dtype == dtype
        assert ties(X, w, d).dtype == dtype and magnitude_prune(X, w, d).dtype == dtype


def test_dare_is_seeded_and_reproducible():
    X = stack(2)
    a = dare_ties(X, WEIGHTS, 0.4, torch.Generator().manual_seed(77))
    b = dare_ties(X, WEIGHTS, 0.4, torch.Generator().manual_seed(77))
    c = dare_ties(X, WEIGHTS, 0.4, torch.Generator().manual_seed(78))
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_dare_statistics_unbiased_and_keep_rate():
    """M = 400 draws of dare_linear on n=3 tasks of 24 x 17 (1224 entries), density d = 0.3.

    Each entry of one draw has mean sum_i w_i x_i and variance v = sum_i w_i^2 x_i^2 (1 - d) / d, so
    the mean of M draws has squared Frobenius error with expectation sum(v) / M; with 408 entries
    per matrix that ratio concentrates near 1 (relative spread about sqrt(2/408) ~ 0.07 for equal
    variances, a few times more for these uneven ones): we require 0.6 < ratio < 1.4. A bias of 1%
    of the entries' mean would add ~0.01^2 * ||mean||^2 * M / sum(v) ~ 0.04 to the ratio.
    Keep rate: the share of kept entries over all draws, N = 400 * 1224 Bernoulli(0.3) trials,
    is within 5 sigma = 5 sqrt(d (1 - d) / N) ~ 0.0033 of d.
    """
    X, d, M = stack(8), 0.3, 400
    w = torch.tensor(WEIGHTS, dtype=torch.float64)
    g = torch.Generator().manual_seed(0)
    target = (X * w[:, None, None]).sum(0)
    total, kept = torch.zeros_like(target), 0
    for _ in range(M):
        dropped = dare_drop(X, d, g)
        kept += int((dropped != 0).sum())
        total += (dropped * w[:, None, None]).sum(0)
    mean = total / M
    var = ((w[:, None, None] ** 2) * X**2).sum(0) * (1 - d) / d
    ratio = float(((mean - target) ** 2).sum() / (var.sum() / M))
    assert 0.6 < ratio < 1.4, ratio
    rate, N = kept / (M * X.numel()), M * X.numel()
    assert abs(rate - d) < 5 * math.sqrt(d * (1 - d) / N), rate


# -- validation -------------------------------------------------------------------------------------
G = torch.Generator


@pytest.mark.parametrize("call,words", [
    (lambda X: magnitude_prune(X[0], WEIGHTS, 0.5), "X must be a floating (n, rows, cols) stack, got torch.float64 "
                                                    "(24, 17); stack the tasks with torch.stack"),
    (lambda X: ties(X.long(), WEIGHTS, 0.5), "X must be a floating (n, rows, cols) stack, got torch.int64"),
    (lambda X: dare_linear(X, WEIGHTS[:2], 0.5, G()), "weights have shape (2,), expected (3,): one weight per task"),
    (lambda X: ties(X, [1.0, float("nan"), 1.0], 0.5), "non-finite value in the tasks or weights; check the inputs"),
    (lambda X: magnitude_prune(X.index_fill(1, torch.tensor([3]), float("inf")), WEIGHTS, 0.5), "non-finite value"),
    (lambda X: ties(X, WEIGHTS, 0.5, "median"), "majority 'median' is not one of total, frequency"),
    (lambda X: dare_ties(X, WEIGHTS, 0.5, G(), "median"), "majority 'median' is not one of total, frequency"),
    (lambda X: ties(X, WEIGHTS, [0.5, 0.5]), "2 densities for 3 tasks; give one, or one per task"),
    (lambda X: ties(X, WEIGHTS, 0.0), "density 0.0 is outside (0, 1]; pass the share of entries to keep, e.g. 0.5"),
    (lambda X: magnitude_prune(X, WEIGHTS, 1.5), "density 1.5 is outside (0, 1]; pass the share of entries to keep"),
    (lambda X: dare_linear(X, WEIGHTS, 0.0, G()), "density 0.0 is outside (0, 1]"),
    (lambda X: dare_linear(X, WEIGHTS, 1.5, G()), "density 1.5 is outside (0, 1]"),
    (lambda X: dare_ties(X, WEIGHTS, [0.5, 1.5, 0.5], G()), "density [0.5, 1.5, 0.5] is outside (0, 1]"),
])
def test_bad_arguments_raise_typed_errors_that_say_what_to_fix(call, words):
    """Every kernel refuses what PEFT would silently accept (density 0 or above 1, an unknown election) or
    what would be wrong (a weight per row, a NaN), with one message naming the argument and the fix."""
    with pytest.raises(MergeArgumentError) as e:
        call(stack(0))
    assert str(e.value).startswith("merge kernel: ") and words in str(e.value)


def test_module_seed_is_stable_and_distinct():
    assert module_seed(3, "layers.0.q_proj") == module_seed(3, "layers.0.q_proj")
    assert len({module_seed(3, "a"), module_seed(3, "b"), module_seed(4, "a")}) == 3
    assert 0 <= module_seed(3, "a") < 2**63


def test_module_seed_is_its_documented_sha256_definition():
    """A recorded DARE merge is reproduced (by vecmerge verify, by PEFT seeded per module) only while each module's
    seed stays what it was when the merge was made: the first 8 bytes of ``sha256(f"{seed}:{module}")`` read
    little-endian, shifted right once (63 bits, a valid ``manual_seed``). Over 64 names the top bit of the 63
    is set at least once (the chance that it never is: 2**-64)."""
    import hashlib

    names = [f"model.layers.{i}.mlp.up_proj" for i in range(64)]
    for seed in (0, 7, 2**40):
        for m in names[:4]:
            digest = hashlib.sha256(f"{seed}:{m}".encode()).digest()
            assert module_seed(seed, m) == int.from_bytes(digest[:8], byteorder="little") // 2
    assert max(module_seed(0, m) for m in names) >= 2**62
    torch.Generator().manual_seed(max(module_seed(0, m) for m in names))  # accepted by torch


# -- SLERP -------------------------------------------------------------------------------------------
def dense_slerp(t: float, v0: np.ndarray, v1: np.ndarray, threshold=0.9995, eps=1e-8) -> np.ndarray:
    """mergekit's definition, written out in float64: directions v/||v|| (||v|| > eps), cos of the angle,
    lerp when |cos| > threshold, else sin((1-t) theta)/sin(theta) v0 + sin(t theta)/sin(theta) v1 on the
    unnormalized vectors."""
    n0, n1 = np.linalg.norm(v0), np.linalg.norm(v1)
    u0 = v0 / n0 if n0 > eps else v0
    u1 = v1 / n1 if n1 > eps else v1
    cos = float(np.sum(u0 * u1))
    if abs(cos) > threshold:
        return (1 - t) * v0 + t * v1
    theta = np.arccos(cos)
    return np.sin(theta - theta * t) / np.sin(theta) * v0 + np.sin(theta * t) / np.sin(theta) * v1


def rand_lr(out, inn, r, seed):
    g = torch.Generator().manual_seed(seed)
    return LowRank(torch.randn(out, r, generator=g, dtype=torch.float64),
                   torch.randn(r, inn, generator=g, dtype=torch.float64), 0.5)


@pytest.mark.parametrize("t", [0.0, 0.25, 0.5, 0.9, 1.0])
@pytest.mark.parametrize("mix", [0.0, 0.6, -0.8, 50.0])  # x1 = x0 * mix + y: various angles; 50 -> colinear
def test_slerp_factored_equals_dense_definition(t, mix):
    """c0 x0 + c1 x1 with coefficients from the factored norms and inner product equals the dense slerp of
    the flattened updates to rtol 1e-12 (float64)."""
    x0 = rand_lr(30, 20, 4, 1)
    x1 = combine([(mix, x0), (1.0, rand_lr(30, 20, 4, 2))])
    c0, c1 = slerp_coefficients(x0.norm(), x1.norm(), x0.inner(x1), t)
    got = combine([(c0, x0), (c1, x1)]).dense()
    ref = dense_slerp(t, x0.dense().numpy(), x1.dense().numpy())
    assert_close(got, torch.from_numpy(ref), rtol=1e-12, atol=1e-12 * float(np.abs(ref).max()))
    if mix == 50.0:
        assert (c0, c1) == (1.0 - t, t)  # cos ~ 0.9998 > 0.9995: the lerp branch


def test_slerp_by_hand_and_zero_norm():
    """Orthonormal x0, x1: theta = pi/2, c0 = sin((1-t) pi/2), c1 = sin(t pi/2); at t = 0.5 both sqrt(2)/2.
    Opposite unit vectors (cos = -1 < -0.9995): lerp. A zero vector: lerp (mergekit would give sin(t pi/2))."""
    c0, c1 = slerp_coefficients(1.0, 1.0, 0.0, 0.5)
    assert c0 == pytest.approx(math.sqrt(0.5), rel=1e-15) and c1 == pytest.approx(math.sqrt(0.5), rel=1e-15)
    c0, c1 = slerp_coefficients(2.0, 3.0, 0.0, 1 / 3)  # angle does not depend on the norms
    assert (c0, c1) == pytest.approx((math.sin(math.pi / 3), math.sin(math.pi / 6)), rel=1e-15)
    assert slerp_coefficients(1.0, 1.0, -1.0, 0.3) == pytest.approx((0.7, 0.3), rel=1e-15)
    assert slerp_coefficients(0.0, 2.0, 0.0, 0.3) == pytest.approx((0.7, 0.3), rel=1e-15)
    assert slerp_coefficients(2.0, 0.0, 0.0, 0.3) == pytest.approx((0.7, 0.3), rel=1e-15)
    for bad in ((1.0, float("inf"), 0.0, 0.5), (-1.0, 1.0, 0.0, 0.5), (1.0, -1.0, 0.0, 0.5), (1.0, 1.0, 0.0, math.nan)):
        with pytest.raises(MergeArgumentError, match=r"slerp: norms, inner product and t must be finite with norms "
                                                     r">= 0, got \("):
            slerp_coefficients(*bad)


def test_slerp_at_the_colinearity_threshold_still_slerps():
    """mergekit interpolates linearly only when |cos| is strictly above 0.9995: at cos = 0.9995 exactly (unit norms,
    inner product 0.9995) the coefficients are the SLERP formula's, sin((1 - t) theta) / sin(theta) and
    sin(t theta) / sin(theta) with theta = arccos(0.9995), to rtol 1e-12; they differ from (1 - t, t) by ~3e-5."""
    theta = math.acos(0.9995)
    for t in (0.25, 0.5):
        want = (math.sin((1 - t) * theta) / math.sin(theta), math.sin(t * theta) / math.sin(theta))
        assert slerp_coefficients(1.0, 1.0, 0.9995, t) == pytest.approx(want, rel=1e-12)
        assert slerp_coefficients(1.0, 1.0, -0.9995, t)[0] == pytest.approx(
            math.sin((1 - t) * (math.pi - theta)) / math.sin(theta), rel=1e-12)
        assert abs(want[0] - (1 - t)) > 1e-5
