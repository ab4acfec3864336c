"""mergekit's methods on LoRA updates (issue 26), each against its definition computed densely in the test.

Inputs: the three PEFT folders of ``test_classic_merges`` (ranks 4, 4, 6; the third rsLoRA). References are
the dense float64 updates read without vecmerge (``dense_updates``) and merged by the numpy definitions of
``merge_references`` (mergekit 0.1.5's formulas, the papers' where mergekit has none); random drops use
the same float32 draws from ``module_seed(seed, module)``. ``test_mergekit_oracle.py`` checks the same
outputs against mergekit's own functions where mergekit is installed. Tolerance: relative Frobenius 1e-6
per module where the output is lossless (the fp32 factors round the update by about 4e-8).
"""

from __future__ import annotations

import json

import pytest
import torch
from merge_references import (
    karcher,
    mergekit_gta,
    mergekit_sce,
    mergekit_sparsify,
    model_stock,
    multislerp,
    nuslerp,
    principal,
    torch_draws,
)

from vecmerge.errors import RecipeError
from vecmerge.pipeline import run
from vecmerge.recipe.recipe import Recipe
from vecmerge.verify.checks.output import verify_output
from vecmerge.workspace.names import Workspace

W3 = [0.5, -1.0, 2.0]
DENS = [0.5, 0.3, 0.7]


def merge(out, **rec):
    return run(Recipe.from_dict({"out": out, **rec}), Workspace())


def models(names, weights=None, densities=None):
    return [{"model": n, "weight": 1.0 if weights is None else weights[i],
             **({"density": densities[i]} if densities else {})} for i, n in enumerate(names)]


def rel(x, ref):
    return float(torch.linalg.norm(x - ref) / torch.linalg.norm(ref))


def check(folder, want, dense_updates, rtol=1e-6):
    got = dense_updates(folder)
    assert set(got) == set(want)
    for m in want:
        assert rel(got[m], want[m]) <= rtol, (m, rel(got[m], want[m]))
    assert verify_output(folder)["passed"]


def test_task_arithmetic_with_lambda_and_normalize(three, dense_updates):
    D = {n: dense_updates(three / n) for n in "abc"}
    merge("ta", method="task_arithmetic", models=models("abc", W3), **{"lambda": 0.7})
    check(three / "ta", {m: 0.7 * sum(w * D[n][m] for w, n in zip(W3, "abc")) for m in D["a"]}, dense_updates)
    rep = merge("tan", method="task_arithmetic", models=models("abc", W3), normalize=True)
    check(three / "tan", {m: sum(w * D[n][m] for w, n in zip(W3, "abc")) / sum(W3) for m in D["a"]}, dense_updates)
    assert {e["rank"] for e in rep.outputs[0].figures["modules"].values()} == {14}  # exact, never dense


@pytest.mark.parametrize("method,normalize,seed", [("ties", True, None), ("ties", False, None),
                                                    ("dare_ties", True, 3), ("dare_linear", True, 3)])
def test_ties_and_dare_with_normalize_follow_mergekit(three, dense_updates, method, normalize, seed):
    """Given normalize, the sign is elected on the weighted tasks and the mean divides by the agreeing weights."""
    D = {n: dense_updates(three / n) for n in "abc"}
    extra = {"seed": seed} if seed is not None else {}
    merge("n", method=method, models=models("abc", W3, DENS), normalize=normalize, rank="exact", **extra)
    want = {}
    for m in D["a"]:
        if method == "ties":
            T = [mergekit_sparsify(D[n][m], d, "magnitude") for n, d in zip("abc", DENS)]
        else:
            draw = torch_draws(seed, m)
            T = [mergekit_sparsify(D[n][m], d, "random", draw=draw) / d for n, d in zip("abc", DENS)]
        want[m] = mergekit_gta(T, W3, consensus=None if method == "dare_linear" else "sum", normalize=normalize)
    check(three / "n", want, dense_updates)


def test_ties_default_is_peft_and_differs_from_mergekit_with_weights(three, dense_updates, peft_mu):
    """Unset normalize keeps PEFT's rule; with weights the two conventions differ by far more than round-off."""
    D = {n: dense_updates(three / n) for n in "abc"}
    merge("peft", method="ties", models=models("abc", W3), density=0.5, rank="exact")
    merge("mk", method="ties", models=models("abc", W3), density=0.5, rank="exact", normalize=True)
    p, k = dense_updates(three / "peft"), dense_updates(three / "mk")
    w = torch.tensor(W3, dtype=torch.float64)
    for m in D["a"]:
        assert rel(p[m], peft_mu.ties([D[n][m] for n in "abc"], w, 0.5, "total")) <= 1e-6
    assert max(rel(k[m], p[m]) for m in p) > 0.1
    merge("peft1", method="ties", models=models("abc"), density=0.5, rank="exact")
    merge("mk1", method="ties", models=models("abc"), density=0.5, rank="exact", normalize=True)
    p1, k1 = dense_updates(three / "peft1"), dense_updates(three / "mk1")
    assert all(rel(k1[m], p1[m]) <= 1e-6 for m in p1)  # all weights 1: the two rules agree


@pytest.mark.parametrize("space", ["full", "core"])
@pytest.mark.parametrize("method,consensus", [("breadcrumbs", None), ("breadcrumbs_ties", "sum")])
def test_breadcrumbs(three, dense_updates, method, consensus, space):
    """Drop the smallest and the gamma share of largest entries; in core space the same in the principal bases."""
    D = {n: dense_updates(three / n) for n in "abc"}
    merge("bc", method=method, models=models("abc", W3, DENS), gamma=0.1, normalize=True, rescale=True,
          rank="exact", space=space, **{"lambda": 0.9})
    want = {}
    for m in D["a"]:
        U, V = principal([D[n][m] for n in "abc"]) if space == "core" else (None, None)
        X = [U.T @ D[n][m] @ V if U is not None else D[n][m] for n in "abc"]
        T = [mergekit_sparsify(x, d, "outliers", gamma=0.1, rescale=True) for x, d in zip(X, DENS)]
        Z = mergekit_gta(T, W3, consensus=consensus, normalize=True, lam=0.9)
        want[m] = U @ Z @ V.T if U is not None else Z
    check(three / "bc", want, dense_updates)


@pytest.mark.parametrize("method,consensus,normalize", [("della", "sum", True), ("della_linear", None, False)])
def test_della(three, dense_updates, method, consensus, normalize):
    """MagPrune: per row, keep probabilities from d - eps (smallest) to d + eps (largest), L1 rescale (mergekit's)."""
    D = {n: dense_updates(three / n) for n in "abc"}
    merge("della", method=method, models=models("abc", W3, DENS), epsilon=0.2, seed=5, rank="exact")
    want = {}
    for m in D["a"]:
        draw = torch_draws(5, m)
        T = [mergekit_sparsify(D[n][m], d, "della", epsilon=0.2, rescale=True, draw=draw) for n, d in zip("abc", DENS)]
        want[m] = mergekit_gta(T, W3, consensus=consensus, normalize=normalize)
    check(three / "della", want, dense_updates)
    man = json.loads((three / "della" / "vecmerge.json").read_text())
    assert man["recipe"]["seed"] == 5 and man["recipe"]["normalize"] is normalize
    with pytest.raises(RecipeError, match="density 0.3 with epsilon 0.3 gives keep probabilities outside"):
        Recipe.from_dict({"method": method, "models": models("abc", None, DENS), "epsilon": 0.3, "rank": 4})


@pytest.mark.parametrize("topk", [1.0, 0.4])
def test_sce(three, dense_updates, topk):
    D = {n: dense_updates(three / n) for n in "abc"}
    merge("sce", method="sce", models=models("abc"), select_topk=topk, rank="exact")
    check(three / "sce", {m: mergekit_sce([D[n][m] for n in "abc"], topk) for m in D["a"]}, dense_updates)


@pytest.mark.parametrize("filter_wise", [False, True])
def test_model_stock(three, dense_updates, filter_wise):
    D = {n: dense_updates(three / n) for n in "abc"}
    rep = merge("ms", method="model_stock", models=models("abc"), filter_wise=filter_wise)
    check(three / "ms", {m: model_stock([D[n][m] for n in "abc"], filter_wise) for m in D["a"]}, dense_updates)
    assert rep.outputs[0].figures["rank"]["max"] <= 14  # factored, never dense


@pytest.mark.parametrize("flags,axis", [({}, None), ({"nuslerp_flatten": False}, 1),
                                        ({"nuslerp_flatten": False, "nuslerp_row_wise": True}, 0)])
def test_nuslerp(three, dense_updates, flags, axis):
    """t = w_1 / (w_0 + w_1) = 2/3; per module, per row or per column."""
    D = {n: dense_updates(three / n) for n in "ab"}
    merge("nu", method="nuslerp", models=models("ab", [1.0, 2.0]), **flags)
    check(three / "nu", {m: nuslerp(D["a"][m], D["b"][m], 2.0 / 3.0, axis) for m in D["a"]}, dense_updates)


def test_multislerp_and_karcher(three, dense_updates):
    D = {n: dense_updates(three / n) for n in "abc"}
    merge("multi", method="multislerp", models=models("abc", [1.0, 1.0, 2.0]))
    check(three / "multi", {m: multislerp([D[n][m] for n in "abc"], [1, 1, 2]) for m in D["a"]}, dense_updates)
    merge("ka", method="karcher", models=models("abc"))
    check(three / "ka", {m: karcher([D[n][m] for n in "abc"]) for m in D["a"]}, dense_updates)


def test_mergekit_methods_recipe_problems(three):
    cases = {
        "method=model_stock: takes no weights": {"method": "model_stock", "models": models("ab", [1.0, 2.0])},
        "method=model_stock: merges at least 2 models, got 1": {"method": "model_stock", "models": ["a"]},
        "method=nuslerp: merges exactly 2 models, got 3": {"method": "nuslerp", "models": ["a", "b", "c"]},
        "method=sce: weighs each model by its own mean square": {"method": "sce", "models": models("ab", [1, 2]),
                                                                 "space": "core"},
        "method=breadcrumbs: needs density": {"method": "breadcrumbs", "models": ["a"], "rank": 4},
        "normalize=1: a bool": {"method": "task_arithmetic", "models": ["a"], "normalize": 1},
        "gamma: only meaningful with method breadcrumbs, breadcrumbs_ties": {"method": "ties", "models": ["a"],
                                                                             "gamma": 0.1},
    }
    for want, rec in cases.items():
        with pytest.raises(RecipeError) as e:
            Recipe.from_dict(rec)
        assert any(p.startswith(want) for p in e.value.problems), (want, e.value.problems)


def test_normalize_flag_and_help(three, run_cli):
    """``--normalize/--no-normalize`` is unset unless given; ``merge --help`` says how the defaults differ."""
    res = run_cli("merge", "--help")
    text = " ".join(res.output.split())
    assert "--normalize / --no-normalize" in text and "mergekit's own default is true for ties" in text
    assert "PEFT's rule" in text
    base = ["merge", "--method", "ties", "a", "b", "--weights", "2,1", "--density", "0.5", "--rank", "exact"]
    for extra, out in (([], "u"), (["--normalize"], "t"), (["--no-normalize"], "f")):
        assert run_cli(*base, *extra, "--out", out).exit_code == 0
    recs = {o: json.loads((three / o / "vecmerge.json").read_text())["recipe"] for o in "utf"}
    assert "normalize" not in recs["u"] and recs["t"]["normalize"] is True and recs["f"]["normalize"] is False
    sha = {o: json.loads((three / o / "vecmerge.json").read_text())["output"]["sha256"] for o in "utf"}
    assert len(set(sha.values())) == 3
