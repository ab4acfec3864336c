"""verify's own element-wise merges against PEFT's ``merge_utils`` and mergekit 0.1.5's functions (the references).

Tasks are random dense matrices (no ties in magnitude); random masks come from torch's global generator seeded
with s in the reference and from ``draws.Stream(s)`` here, so both draw the same masks. Tolerance: rel 1e-12 for
float64 references; 1e-6 where the reference works in float32 (PEFT's DARE on float32 tasks, mergekit's DARE and
DELLA, which upcast to float32 on the CPU).
"""

import numpy as np
import pytest
import torch

from vecmerge.verify.independent.draws import Stream
from vecmerge.verify.independent.elementwise import della_probabilities, gta, peft, sce, top

merge_utils = pytest.importorskip("peft.utils.merge_utils")

SEED = 1234
W = [0.7, 1.3, -0.4]


def tasks(n=3, shape=(12, 20), seed=0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, *shape))


def rel(a, b) -> float:
    return float(np.linalg.norm(np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64))
                 / np.linalg.norm(np.asarray(b, dtype=np.float64)))


def test_top_keeps_the_k_largest_and_the_lowest_index_among_ties():
    a = np.array([[3.0, 1.0, 2.0], [2.0, 0.0, 2.0]])
    assert top(a, 2).tolist() == [[True, False, True], [False, False, False]]
    assert top(a, 3).tolist() == [[True, False, True], [True, False, False]]  # the tie at 2: flat index 2 < 3 < 5
    assert not top(a, 0).any() and top(a, 6).all()


@pytest.mark.parametrize("majority", ["total", "frequency"])
def test_ties_and_magnitude_prune_equal_peft(majority):
    X = tasks()
    T = [torch.from_numpy(x) for x in X]
    w = torch.tensor(W, dtype=torch.float64)
    want = merge_utils.ties(T, w, 0.4, majority)
    assert rel(peft(X, W, [0.4] * 3, "magnitude", "ties", majority, None), want.numpy()) <= 1e-12
    want = merge_utils.magnitude_prune(T, w, 0.4)
    assert rel(peft(X, W, [0.4] * 3, "magnitude", "sum", majority, None), want.numpy()) <= 1e-12


@pytest.mark.parametrize("kind", ["dare_linear", "dare_ties"])
def test_dare_equals_peft_with_the_same_stream(kind):
    X = tasks()
    T = [torch.from_numpy(x).float() for x in X]  # PEFT draws in the tasks' dtype: float32, as the pipeline's masks
    torch.manual_seed(SEED)
    want = getattr(merge_utils, kind)(T, torch.tensor(W), 0.6)
    got = peft(X.astype(np.float32).astype(np.float64), W, [0.6] * 3, "random", kind[5:].replace("linear", "sum"),
               "total", Stream(SEED))
    assert rel(got, want.numpy()) <= 1e-6


def mergekit_gta(X, w, ds, method, consensus, normalize, lam, rescale, seed=SEED, **kw):
    """mergekit 0.1.5's GeneralizedTaskArithmeticMerge.merge_group, its body written out on mergekit's functions."""
    sparsify = pytest.importorskip("mergekit.sparsify")
    gta_mod = pytest.importorskip("mergekit.merge_methods.generalized_task_arithmetic")
    torch.manual_seed(seed)
    deltas = torch.stack([sparsify.sparsify(torch.from_numpy(x), density=d, method=method,
                                            rescale_norm=sparsify.RescaleNorm.l1 if rescale else None, **kw)
                          for x, d in zip(X, ds)]).double()
    weights = torch.tensor(w, dtype=torch.float64).view(-1, 1, 1)
    deltas = deltas * weights
    if consensus:
        mask = gta_mod.get_mask(deltas, method=consensus)
        mixed, divisor = (deltas * mask).sum(0), (weights * mask).sum(0)
        divisor[divisor == 0] = 1
    else:
        mixed, divisor = deltas.sum(0), weights.sum(0)
        divisor[divisor.abs() < 1e-8] = 1
    if normalize:
        mixed = mixed / divisor
    return (mixed * lam).numpy()


@pytest.mark.parametrize("consensus, normalize, rescale", [("sum", True, False), ("count", False, True),
                                                            (None, True, True)])
def test_mergekit_magnitude_and_outliers(consensus, normalize, rescale):
    X, ds = tasks(), [0.5, 0.3, 0.8]
    p = {"rescale": "l1" if rescale else "none", "consensus": consensus or "none", "normalize": normalize,
         "lam": 1.5, "gamma": 0.05, "epsilon": 0.0}
    want = mergekit_gta(X, W, ds, "magnitude", consensus, normalize, 1.5, rescale)
    assert rel(gta(X, W, ds, {**p, "sparsify": "magnitude"}, None), want) <= 1e-12
    want = mergekit_gta(X, W, ds, "magnitude_outliers", consensus, normalize, 1.5, rescale, gamma=0.05)
    assert rel(gta(X, W, ds, {**p, "sparsify": "outliers"}, None), want) <= 1e-12


@pytest.mark.parametrize("method, kw", [("random", {}), ("della_magprune", {"epsilon": 0.1})])
@pytest.mark.parametrize("consensus, normalize, rescale", [("sum", True, True), (None, False, False)])
def test_mergekit_random_drops_with_the_same_stream(method, kw, consensus, normalize, rescale):
    X, ds = tasks(), [0.5, 0.3, 0.6]
    p = {"sparsify": "random" if method == "random" else "della", "rescale": "l1" if rescale else "none",
         "consensus": consensus or "none", "normalize": normalize, "lam": 1.0, "gamma": 0.0, "epsilon": 0.1}
    want = mergekit_gta(X, W, ds, method, consensus, normalize, 1.0, rescale, **kw)
    assert rel(gta(X, W, ds, p, Stream(SEED)), want) <= 1e-6
    other = gta(X, W, ds, p, Stream(SEED + 1))
    assert rel(other, want) > 0.1  # the stream matters: another seed is another merge


def test_della_probabilities_run_from_d_minus_eps_to_d_plus_eps_by_rank():
    x = np.array([[0.1, -3.0, 2.0, 0.5, -1.0]])
    p = della_probabilities(x, 0.5, 0.1)
    assert p.dtype == np.float32
    np.testing.assert_allclose(p[0], [0.4, 0.6, 0.55, 0.45, 0.5], rtol=1e-6)


def test_inverse_rescale_is_one_over_density():
    X, ds = tasks(), [0.5, 0.5, 0.5]
    p = {"sparsify": "random", "rescale": "inverse", "consensus": "none", "normalize": False, "lam": 1.0}
    mask = Stream(SEED)
    masks = [mask.bernoulli(np.full(X[0].shape, 0.5)) for _ in range(3)]
    want = sum(w * x * m / 0.5 for w, x, m in zip(W, X, masks))
    assert rel(gta(X, W, ds, p, Stream(SEED)), want) <= 1e-12


@pytest.mark.parametrize("topk", [1.0, 0.3])
def test_sce_equals_mergekit(topk):
    sce_mod = pytest.importorskip("mergekit.merge_methods.sce")
    gta_mod = pytest.importorskip("mergekit.merge_methods.generalized_task_arithmetic")
    X = tasks()
    tv = torch.from_numpy(X)
    if topk < 1:
        tv = tv * sce_mod.sce_mask(tv, topk, tv.dtype).unsqueeze(0)
    erase = gta_mod.get_mask(tv, method="sum", mask_dtype=tv.dtype)
    ew = sce_mod.sce_weight(tv).view(-1, 1, 1) * erase
    want = ((tv * ew).sum(0) / ew.sum(0).clamp(min=1e-6)).numpy()
    assert rel(sce(X, topk), want) <= 1e-12


def test_row_blocks_give_the_one_block_result(monkeypatch):
    """Combining a few rows at a time (bounded memory on large modules) changes no entry (rel 1e-15)."""
    import vecmerge.verify.independent.elementwise as ew

    X, ds = tasks(shape=(40, 20)), [0.5, 0.3, 0.6]
    p = {"sparsify": "magnitude", "rescale": "l1", "consensus": "sum", "normalize": True, "lam": 1.0}
    whole = (peft(X, W, ds, "random", "ties", "total", Stream(SEED)), gta(X, W, ds, p, None))
    monkeypatch.setattr(ew, "BLOCK_BYTES", 8 * 3 * 20 * 7)  # 7 rows a block: 6 blocks, the last of 5
    assert len(ew._blocks(X)) == 6
    blocked = (peft(X, W, ds, "random", "ties", "total", Stream(SEED)), gta(X, W, ds, p, None))
    for a, b in zip(whole, blocked):
        assert rel(b, a) <= 1e-15
