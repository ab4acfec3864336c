"""The same merges against mergekit's own functions on the dense updates (test-only oracle; skipped without mergekit).

mergekit 0.1.5 (``mergekit.merge_methods.api.merge_tensors``) merges full tensors; on LoRA updates the base is
the origin: a zero tensor as its ``base_model``, the dense updates (read without vecmerge) as its models.
Random drops match draw for draw: mergekit draws from torch's global generator in float32, task after task,
so seeding it with ``module_seed(seed, module)`` before each module gives vecmerge's masks. For DARE
vecmerge rescales by ``1 / density`` (the paper's and PEFT's) and mergekit by the L1 norm: mergekit is given
the updates divided by their density and ``rescale: false``. The numpy references of ``merge_references``
are checked against mergekit too, so the always-run tests stand on a reference mergekit agrees with.
Tolerance: relative Frobenius 1e-6 per module (3e-6 for DELLA, which mergekit computes in float32).
"""

from __future__ import annotations

import pytest
import torch
from merge_references import mergekit_gta, mergekit_sparsify, model_stock, nuslerp, torch_draws

from vecmerge.linalg.merge_kernels import module_seed
from vecmerge.pipeline import run
from vecmerge.recipe.recipe import Recipe
from vecmerge.workspace.names import Workspace

api = pytest.importorskip("mergekit.merge_methods.api", reason="mergekit is an optional test-only oracle",
                         exc_type=ImportError)  # absent, or installed but not importable here

W3 = [0.5, -1.0, 2.0]
DENS = [0.5, 0.3, 0.7]


def rel(x, ref):
    return float(torch.linalg.norm(x - ref) / torch.linalg.norm(ref))


def mergekit(method, tasks, params, base=True, seed=None, module=None):
    if seed is not None:
        torch.manual_seed(module_seed(seed, module))
    if not base:
        return api.merge_tensors(tasks, method, parameters=params)
    return api.merge_tensors([torch.zeros_like(tasks[0]), *tasks], method, parameters=params, base_index=0)


CASES = [  # (vecmerge recipe, mergekit method, mergekit parameters, models, seed)
    ({"method": "task_arithmetic", "lambda": 0.7}, "task_arithmetic", {"weight": W3, "lambda": 0.7}, "abc", None),
    ({"method": "task_arithmetic", "normalize": True}, "task_arithmetic", {"weight": W3, "normalize": True}, "abc",
     None),
    ({"method": "ties", "normalize": True, "rank": "exact"}, "ties", {"weight": W3, "density": DENS}, "abc", None),
    ({"method": "breadcrumbs", "gamma": 0.1, "rank": "exact"}, "breadcrumbs",
     {"weight": W3, "density": DENS, "gamma": 0.1}, "abc", None),
    ({"method": "breadcrumbs_ties", "gamma": 0.05, "normalize": True, "rank": "exact"}, "breadcrumbs_ties",
     {"weight": W3, "density": DENS, "gamma": 0.05, "normalize": True}, "abc", None),
    ({"method": "della", "epsilon": 0.2, "seed": 4, "rank": "exact"}, "della",
     {"weight": W3, "density": DENS, "epsilon": 0.2}, "abc", 4),
    ({"method": "della_linear", "epsilon": 0.1, "seed": 4, "rank": "exact"}, "della_linear",
     {"weight": W3, "density": DENS, "epsilon": 0.1}, "abc", 4),
    ({"method": "dare_ties", "normalize": True, "seed": 6, "rank": "exact"}, "dare_ties",
     {"weight": W3, "density": DENS, "rescale": False, "normalize": True}, "abc", 6),
    ({"method": "dare_linear", "normalize": True, "seed": 6, "rank": "exact"}, "dare_linear",
     {"weight": W3, "density": DENS, "rescale": False, "normalize": True}, "abc", 6),
    ({"method": "sce", "select_topk": 0.4, "rank": "exact"}, "sce", {"select_topk": 0.4}, "abc", None),
    ({"method": "model_stock"}, "model_stock", {}, "abc", None),
    ({"method": "model_stock", "filter_wise": True}, "model_stock", {"filter_wise": True}, "abc", None),
    ({"method": "nuslerp"}, "nuslerp", {"weight": [1.0, 2.0]}, "ab", None),
    ({"method": "nuslerp", "nuslerp_flatten": False}, "nuslerp", {"weight": [1.0, 2.0], "nuslerp_flatten": False},
     "ab", None),
    ({"method": "nuslerp", "nuslerp_flatten": False, "nuslerp_row_wise": True}, "nuslerp",
     {"weight": [1.0, 2.0], "nuslerp_flatten": False, "nuslerp_row_wise": True}, "ab", None),
    ({"method": "multislerp"}, "multislerp", {"weight": [1.0, 1.0, 2.0]}, "abc", None),
    ({"method": "karcher"}, "karcher", {}, "abc", None),
]
WEIGHTED = {"task_arithmetic", "ties", "breadcrumbs", "breadcrumbs_ties", "della", "della_linear", "dare_ties",
            "dare_linear"}


@pytest.mark.parametrize("rec,method,params,names,seed", CASES,
                         ids=["-".join(str(v) for k, v in c[0].items() if k not in ("rank", "seed")) for c in CASES])
def test_same_update_as_mergekit(three, dense_updates, rec, method, params, names, seed):
    D = {n: dense_updates(three / n) for n in names}
    w = params.get("weight", [1.0] * len(names))
    entries = [{"model": n, "weight": w[i] if rec["method"] in WEIGHTED or rec["method"] in ("nuslerp", "multislerp")
                else 1.0, **({"density": DENS[i]} if "density" in params else {})} for i, n in enumerate(names)]
    run(Recipe.from_dict({"out": "out", "models": entries, **rec}), Workspace())
    got = dense_updates(three / "out")
    dare = method.startswith("dare")
    for m in got:
        tasks = [D[n][m] / DENS[i] if dare else D[n][m] for i, n in enumerate(names)]
        want = mergekit(method, tasks, params, base=method != "karcher", seed=seed, module=m)
        tol = 3e-6 if method.startswith("della") else 1e-6
        assert rel(got[m], want) <= tol, (m, rel(got[m], want))


def test_the_numpy_references_agree_with_mergekit(three, dense_updates):
    """The references the always-run tests use, against mergekit: TIES (normalize), breadcrumbs, DELLA, Model Stock,
    NuSLERP (a row-wise case)."""
    D = {n: dense_updates(three / n) for n in "abc"}
    for m in list(D["a"])[:4]:
        X = [D[n][m] for n in "abc"]
        T = [mergekit_sparsify(x, d, "magnitude") for x, d in zip(X, DENS)]
        assert rel(mergekit_gta(T, W3, consensus="sum", normalize=True),
                   mergekit("ties", X, {"weight": W3, "density": DENS})) <= 1e-12
        T = [mergekit_sparsify(x, d, "outliers", gamma=0.1) for x, d in zip(X, DENS)]
        assert rel(mergekit_gta(T, W3), mergekit("breadcrumbs", X, {"weight": W3, "density": DENS, "gamma": 0.1})) \
            <= 1e-12
        draw = torch_draws(2, m)
        T = [mergekit_sparsify(x, d, "della", epsilon=0.2, rescale=True, draw=draw) for x, d in zip(X, DENS)]
        theirs = mergekit("della", X, {"weight": W3, "density": DENS, "epsilon": 0.2}, seed=2, module=m)
        assert rel(mergekit_gta(T, W3, consensus="sum", normalize=True), theirs) <= 3e-6
        assert rel(model_stock(X, True), mergekit("model_stock", X, {"filter_wise": True})) <= 1e-12
        assert rel(nuslerp(X[0], X[1], 0.25, 1),
                   mergekit("nuslerp", X[:2], {"weight": [3.0, 1.0], "nuslerp_flatten": False})) <= 1e-12
