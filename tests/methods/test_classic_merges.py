"""``vecmerge merge``: every classic method against an independent dense definition, and verify on each output.

Inputs: three PEFT folders with random factors (ranks 4, 4 and 6, the third rsLoRA). References are
read without vecmerge (``dense_updates``: safetensors + PEFT's scale rule) and merged by PEFT's own
``merge_utils`` (TIES, DARE, magnitude pruning), mergekit's SLERP formula or a dense float64 SVD.
Tolerances, relative Frobenius per module: 1e-6 where the output is lossless (the fp32 factors round
the update by ~4e-8), 1e-5 against a dense optimal cut (fp32 rounding plus float64 SVD round-off);
recorded figures reproduce to rtol 1e-6.
"""

from __future__ import annotations

import json
import math
import re

import pytest
import torch
from merge_references import optimal_cut, peft_elementwise, principal
from safetensors.torch import load_file

from vecmerge.pipeline import run
from vecmerge.recipe.recipe import Recipe
from vecmerge.report.merge import render_merge
from vecmerge.testing import toy_adapter
from vecmerge.verify.checks.output import verify_output
from vecmerge.workspace.names import Workspace

W3 = [0.5, -1.0, 2.0]


def merge(out: str, **rec):
    return run(Recipe.from_dict({"out": out, **rec}), Workspace())


def models(names, weights=None, densities=None):
    out = []
    for i, n in enumerate(names):
        e = {"model": n, "weight": 1.0 if weights is None else weights[i]}
        if densities is not None:
            e["density"] = densities[i]
        out.append(e)
    return out


def rel(x: torch.Tensor, ref: torch.Tensor) -> float:
    return float(torch.linalg.norm(x - ref) / torch.linalg.norm(ref))


def assert_modules_close(got: dict, want: dict, rtol: float):
    assert set(got) == set(want)
    for m in want:
        assert rel(got[m], want[m]) <= rtol, (m, rel(got[m], want[m]))


def test_linear_and_cat_are_the_weighted_sum_of_the_updates(three, dense_updates):
    D = {n: dense_updates(three / n) for n in "abc"}
    want = {m: sum(w * D[n][m] for w, n in zip(W3, "abc")) for m in D["a"]}
    for method in ("linear", "cat"):
        rep = merge(method, method=method, models=models("abc", W3))
        assert_modules_close(dense_updates(three / method), want, 1e-6)
        ranks = {e["rank"] for e in rep.outputs[0].figures["modules"].values()}
        assert ranks == {14}  # 4 + 4 + 6: the exact rank of a generic sum, and cat's concatenation
        assert rep.outputs[0].figures["survival"] == pytest.approx(1.0, abs=1e-6)
        assert verify_output(three / method)["passed"]
    moved = rep.outputs[0].figures["moved"]  # ||sum - x_i|| / ||x_i|| over all modules, for each model
    for e, n in zip(moved, "abc"):
        d2 = sum(float(((want[m] - D[n][m]) ** 2).sum()) for m in want)
        n2 = sum(float((D[n][m] ** 2).sum()) for m in want)
        assert e["model"] == n and e["distance"] == pytest.approx(math.sqrt(d2 / n2), rel=1e-9)
    assert "distance of the intended merge from each model" in render_merge(rep)
    cat = load_file(str(three / "cat" / "adapter_model.safetensors"))
    a = load_file(str(three / "a" / "adapter_model.safetensors"))
    key = "base_model.model.model.layers.0.mlp.up_proj.lora_A.weight"
    assert torch.equal(cat[key][:4], a[key])  # cat writes the models' own A factors, bit for bit


def test_svd_is_the_optimal_cut_of_the_sum(three, dense_updates):
    D = {n: dense_updates(three / n) for n in "abc"}
    rep = merge("svd", method="svd", models=models("abc", W3), rank=5)
    got, man = dense_updates(three / "svd"), json.loads((three / "svd" / "vecmerge.json").read_text())
    land = tsq = 0.0
    for m in D["a"]:
        T = sum(w * D[n][m] for w, n in zip(W3, "abc"))
        R = optimal_cut(T, 5)
        assert rel(got[m], R) <= 1e-5, m
        assert man["modules"][m]["rel_error"] == pytest.approx(rel(R, T), rel=1e-6)
        land, tsq = land + float((got[m] * T).sum()), tsq + float((T * T).sum())
    assert rep.outputs[0].figures["survival"] == pytest.approx(land / tsq, rel=1e-6)
    assert rep.outputs[0].warnings and "of the intended svd merge survives" in rep.outputs[0].warnings[0]
    assert verify_output(three / "svd")["passed"]


@pytest.mark.parametrize("method,extra", [("ties", {}), ("ties", {"majority": "frequency"}), ("magnitude_prune", {}),
                                          ("dare_ties", {"seed": 7}), ("dare_linear", {"seed": 7})])
def test_full_space_is_the_method_on_the_dense_updates(three, dense_updates, peft_mu, method, extra):
    """Per-model densities, weights and rsLoRA scales; the dense result written at full rank (lossless), then cut."""
    D = {n: dense_updates(three / n) for n in "abc"}
    dens = [0.5, 0.3, 0.7]
    rec = dict(method=method, models=models("abc", W3, dens), space="full", **extra)
    want = {m: peft_elementwise(peft_mu, method, [D[n][m] for n in "abc"], W3, dens, extra.get("majority", "total"),
                                extra.get("seed"), m) for m in D["a"]}
    rep = merge("exact", rank="exact", **rec)
    assert_modules_close(dense_updates(three / "exact"), want, 1e-6)
    assert all(e["cut"] == "full" for e in rep.outputs[0].figures["modules"].values())
    merge("cut", rank=6, **rec)
    got = dense_updates(three / "cut")
    man = json.loads((three / "cut" / "vecmerge.json").read_text())
    for m, T in want.items():
        assert rel(got[m], optimal_cut(T, 6)) <= 1e-5, m
        assert man["modules"][m]["rel_error"] == pytest.approx(rel(optimal_cut(T, 6), T), rel=1e-6)
    for out in ("exact", "cut"):
        assert verify_output(three / out)["passed"]


def test_dare_masks_come_from_the_recorded_seed(three, run_cli):
    args = ["merge", "--method", "dare_ties", "a", "b", "--density", "0.5", "--rank", "4"]
    assert run_cli(*args, "--seed", "3", "--out", "s3").exit_code == 0
    assert run_cli(*args, "--seed", "3", "--out", "s3b").exit_code == 0
    assert run_cli(*args, "--seed", "4", "--out", "s4").exit_code == 0
    sha = {o: json.loads((three / o / "vecmerge.json").read_text())["output"]["sha256"] for o in ("s3", "s3b", "s4")}
    assert sha["s3"] == sha["s3b"] != sha["s4"]
    man = json.loads((three / "s3" / "vecmerge.json").read_text())
    assert man["recipe"]["seed"] == 3 and man["resolved"]["space"] == "dense"
    assert {e["cut"] for e in man["modules"].values()} == {"full"}  # small modules: the full SVD (optimal)
    assert verify_output(three / "s3")["passed"]
    man["recipe"]["seed"] = 4  # a manifest that claims another seed no longer re-derives its weights
    (three / "s3" / "vecmerge.json").write_text(json.dumps(man))
    res = verify_output(three / "s3")
    rows = {c["name"]: c for c in res["checks"]}  # verify's own path re-draws the seed: its row replaces update's
    assert not res["passed"] and not rows["independent"]["passed"] and "update" not in rows


@pytest.mark.parametrize("method,extra", [("ties", {}), ("magnitude_prune", {}), ("dare_ties", {"seed": 1})])
def test_core_space_is_the_method_in_the_principal_bases_of_the_updates(three, dense_updates, peft_mu, method,
                                                                        extra):
    """Reference bases: numpy's SVD of the dense updates ``[D_a D_b D_c]`` and ``[D_a; D_b; D_c]``; unique up to
    column signs, with which the element-wise methods commute (a sign flips a row or column of every core alike)."""
    D = {n: dense_updates(three / n) for n in "abc"}
    rep = merge(method, method=method, models=models("abc", W3), density=0.5, space="core", **extra)
    got = dense_updates(three / method)
    for m in D["a"]:
        U, V = principal([D[n][m] for n in "abc"])
        assert U.shape[1] == min(14, D["a"][m].shape[0])
        C = peft_elementwise(peft_mu, method, [U.T @ D[n][m] @ V for n in "abc"], W3, [0.5] * 3,
                             seed=extra.get("seed"), module=m)
        assert rel(got[m], U @ C @ V.T) <= 1e-6, m
    assert rep.outputs[0].figures["rank"]["max"] <= 14  # never above the core's size
    assert verify_output(three / method)["passed"]


def test_core_space_ties_ignores_the_order_of_the_models_and_the_factors_gauge(three, dense_updates):
    merge("abc", method="ties", models=models("abc", W3), density=0.4, space="core")
    merge("cab", method="ties", models=models("cab", [W3[2], W3[0], W3[1]]), density=0.4, space="core")
    x, y = dense_updates(three / "abc"), dense_updates(three / "cab")
    for m in x:
        assert rel(y[m], x[m]) <= 1e-6, m


def mergekit_slerp(x0: torch.Tensor, x1: torch.Tensor, t: float) -> torch.Tensor:
    """mergekit's slerp on flattened float64 tensors (normalized copies for the angle, eps 1e-8, threshold 0.9995)."""
    v0, v1 = x0.flatten(), x1.flatten()
    n0, n1 = v0 / v0.norm(), v1 / v1.norm()
    dot = float((n0 * n1).sum())
    if abs(dot) > 0.9995:
        return (1 - t) * x0 + t * x1
    theta = math.acos(dot)
    return (math.sin((1 - t) * theta) * x0 + math.sin(t * theta) * x1) / math.sin(theta)


def test_slerp_per_module_and_global(three, dense_updates):
    D = {n: dense_updates(three / n) for n in "ab"}
    merge("sm", method="slerp", models=["a", "b"], t=0.3)
    assert_modules_close(dense_updates(three / "sm"), {m: mergekit_slerp(D["a"][m], D["b"][m], 0.3) for m in D["a"]},
                         1e-6)
    rep = merge("sg", method="slerp", models=["a", "b"], t=0.3, slerp_scope="global")
    names = list(D["a"])
    flat = mergekit_slerp(torch.cat([D["a"][m].flatten() for m in names]),
                          torch.cat([D["b"][m].flatten() for m in names]), 0.3)
    want, at = {}, 0
    for m in names:
        want[m] = flat[at:at + D["a"][m].numel()].reshape(D["a"][m].shape)
        at += D["a"][m].numel()
    assert_modules_close(dense_updates(three / "sg"), want, 1e-6)
    man = json.loads((three / "sg" / "vecmerge.json").read_text())
    assert set(man["resolved"]["method_params"]) == {"c0", "c1"}
    assert "c0 = " in render_merge(rep)
    assert verify_output(three / "sm")["passed"] and verify_output(three / "sg")["passed"]
    assert not any("slerp" in w for w in rep.outputs[0].warnings)
    far = merge("sx", method="slerp", models=["a", "b"], t=2.0)  # mergekit's formula extrapolates; we say so
    assert_modules_close(dense_updates(three / "sx"), {m: mergekit_slerp(D["a"][m], D["b"][m], 2.0) for m in D["a"]},
                         1e-6)
    assert any("slerp at t=2 extrapolates beyond the arc" in w for w in far.outputs[0].warnings)


def test_selection_and_multipliers_in_a_merge(three, dense_updates):
    D = {n: dense_updates(three / n) for n in "ab"}
    rep = merge("sel", method="linear", models=["a", "b"], only=r"mlp|q_proj", exclude=r"layers\.1\.mlp\.down",
                multipliers={"gate_proj": 0.0, "mlp": 2.0, ".": 0.5})
    chosen = [m for m in D["a"] if re.search(r"mlp|q_proj", m) and "layers.1.mlp.down" not in m]
    got = dense_updates(three / "sel")
    assert sorted(got) == sorted(chosen)
    for m in chosen:
        k = 0.0 if "gate_proj" in m else 2.0 if "mlp" in m else 0.5
        want = k * (D["a"][m] + D["b"][m])
        if k == 0.0:
            assert float(got[m].abs().max()) == 0.0
        else:
            assert rel(got[m], want) <= 1e-6, m
    man = json.loads((three / "sel" / "vecmerge.json").read_text())
    sel = man["resolved"]["selection"]
    assert sel["selected"] == len(chosen) and sel["of"] == 14 and len(sel["left_out"]) == 14 - len(chosen)
    assert man["resolved"]["multipliers"]["model.layers.0.self_attn.q_proj"] == 0.5
    text = render_merge(rep)
    assert f"modules: {len(chosen)} of 14 selected" in text and "not written" in text and "x0.5" in text
    card = (three / "sel" / "README.md").read_text()
    assert "linear(a, b)" in card and f"modules: {len(chosen)} of 14 selected" in card
    assert "survival of the intended merge = " in card
    assert verify_output(three / "sel")["passed"]


def test_merge_recipe_errors_are_reported_at_once(three):
    from vecmerge.errors import RecipeError

    with pytest.raises(RecipeError) as e:
        Recipe.from_dict({"method": "slerp", "models": ["a", "b", "c"], "weights": 1, "base": "a"})
    msg = str(e.value)
    assert "exactly two models, got 3" in msg and "needs t" in msg and "takes no base" in msg and "weights" in msg
    cases = {
        "needs density": {"method": "ties", "models": ["a", "b"], "rank": 4},
        "pass rank": {"method": "ties", "models": ["a", "b"], "density": 0.5},
        "method=svd: needs rank": {"method": "svd", "models": ["a", "b"]},
        "does not apply": {"method": "cat", "models": ["a", "b"], "rank": 4},
        "only meaningful with a merge method": {"base": "a", "models": ["b"]},
        "method: missing": {"models": ["a", "b"]},
        "needs models": {"method": "linear"},
        "models[1].density=1.5": {"method": "ties", "models": ["a", {"model": "b", "density": 1.5}], "density": 0.5,
                                  "rank": 3},
        "models[0]: unknown key(s) ['wieght']": {"method": "linear", "models": [{"model": "a", "wieght": 2}]},
        "density=0.0": {"method": "ties", "models": ["a"], "density": 0.0, "space": "core"},
        "not a regular expression": {"method": "linear", "models": ["a"], "only": "mlp("},
        "has no backbone": {"method": "linear", "models": ["a"], "rank": "keep-base"},
    }
    for want, rec in cases.items():
        with pytest.raises(RecipeError, match=re.escape(want)):
            Recipe.from_dict(rec)
    with pytest.raises(RecipeError) as e:  # an invalid density is one problem, not also a missing one
        Recipe.from_dict({"method": "ties", "models": ["a"], "density": 1.5, "space": "core"})
    assert e.value.problems == ["density=1.5: between 0 and 1"]
    ok = Recipe.from_dict({"method": "ties", "models": [{"model": "a", "parameters": {"weight": 0.5, "density": 0.3}}],
                           "space": "core"})  # mergekit's nesting
    assert ok.models == [{"model": "a", "weight": 0.5, "density": 0.3}]
    from vecmerge.errors import RecipeError as RE

    for rec, want in (({"only": "nothing_matches"}, "selects none of the 14 modules"),
                      ({"multipliers": {"mlp": 2.0, "up_proj": 3.0}}, "multipliers.up_proj: applies to none")):
        with pytest.raises(RE, match=re.escape(want)):
            run(Recipe.from_dict({"method": "linear", "models": ["a"], **rec}), Workspace(), dry_run=True)


def test_cli_recipe_and_manifest_rerun_write_the_same_bytes(three, run_cli):
    args = ["merge", "--method", "ties", "a", "b - a", "c", "--weights", "0.5,-1,2", "--density", "0.4", "--rank",
            "6", "--only", "mlp"]
    res = run_cli(*args, "--out", "cli")
    assert res.exit_code == 0, res.output
    assert "merge: ties of a, b - a, c (weights 0.5, -1, 2; density 0.4; space full" in res.output
    (three / "r.yaml").write_text("method: ties\nmodels:\n  - {model: a, weight: 0.5}\n  - {model: b - a, weight: -1}\n"
                                  "  - {model: c, weight: 2}\ndensity: 0.4\nrank: 6\nonly: mlp\nout: yaml\n")
    assert run_cli("run", "r.yaml").exit_code == 0
    assert run_cli("run", "cli/vecmerge.json", "--out", "rerun").exit_code == 0
    sha = {o: json.loads((three / o / "vecmerge.json").read_text())["output"]["sha256"]
           for o in ("cli", "yaml", "rerun")}
    assert len(set(sha.values())) == 1
    res = run_cli("verify", "cli")
    assert res.exit_code == 0, res.output
    res = run_cli("merge", "--method", "svd", "a", "b", "--rank", "2", "--strict", "--out", "strict")
    assert res.exit_code == 1 and "of the intended svd merge survives" in res.output and not (three / "strict").exists()
    for bad, want in ((["--weights", "1,2"], "2 weight(s) for 3 INPUT(s)"), (["--weights", "1,x,2"], "comma-separated"),
                      ([], "pass --rank")):
        cmd = ["merge", "--method", "ties", "a", "b", "c", "--density", "0.5", "--out", "bad", *bad]
        if "pass --rank" not in want:
            cmd += ["--rank", "4"]
        res = run_cli(*cmd)
        assert res.exit_code == 2 and want in res.output and not (three / "bad").exists(), res.output
        assert len(res.output.strip().splitlines()) == 1


def test_full_space_on_large_modules_uses_the_randomized_cut_with_its_exact_error(tmp_path, monkeypatch,
                                                                                  dense_updates, peft_mu):
    """Modules whose smaller side exceeds 4 (k + oversample) go through the randomized SVD: its error is exact
    (rtol 1e-6 against the dense difference) and within 1% of the optimal cut here (2 power iterations)."""
    shapes = {"model.layers.0.mlp.up_proj": (400, 300), "model.layers.0.self_attn.q_proj": (300, 300)}
    for i, n in enumerate("xy"):
        toy_adapter(tmp_path / n, shapes=shapes, rank=8, seed=10 + i)
    monkeypatch.chdir(tmp_path)
    rep = merge("big", method="ties", models=["x", "y"], density=0.3, rank=8)
    man = json.loads((tmp_path / "big" / "vecmerge.json").read_text())
    assert man["resolved"]["randomized_svd"]["seed"] == 0
    D = {n: dense_updates(tmp_path / n) for n in "xy"}
    got = dense_updates(tmp_path / "big")
    for m in shapes:
        T = peft_mu.ties([D["x"][m], D["y"][m]], torch.tensor([1.0, 1.0], dtype=torch.float64), 0.3, "total")
        e = rep.outputs[0].figures["modules"][m]
        assert e["cut"] == "randomized" and e["power_iters"] == 2 and e["exact_rank"] is None
        assert e["rel_error"] == pytest.approx(rel(got[m], T), rel=1e-6)
        assert rel(got[m], T) <= 1.01 * rel(optimal_cut(T, 8), T), m
    assert verify_output(tmp_path / "big")["passed"]


def test_elementwise_recipe_problems_word_for_word(three):
    """The element-wise methods' own checks name the key, the models concerned and the fix; an invalid space is
    reported and the remaining checks take the documented default (full), which needs a rank."""
    from vecmerge.errors import RecipeError

    rank_fix = ("in space full: its dense result has full rank; pass rank (the inputs' rank, as PEFT's *_svd does, "
                "or energy:0.9), or use space core (exact on the inputs' shared basis, no rank needed)")
    cases = [
        ({"method": "ties", "models": ["a", "b"], "rank": 4},
         ["method=ties: needs density (e.g. --density 0.5), or a density for each model (missing for a, b)"]),
        ({"method": "dare_linear", "models": ["a", {"model": "b", "density": 0.3}, "c"], "rank": 4},
         ["method=dare_linear: needs density (e.g. --density 0.5), or a density for each model (missing for a, c)"]),
        ({"method": "magnitude_prune", "models": ["a"], "density": 0.5}, [f"method=magnitude_prune {rank_fix}"]),
        ({"method": "ties", "models": ["a"], "density": 0.5, "space": "sideways"},
         ["space='sideways': one of full, core", f"method=ties {rank_fix}"]),
        ({"method": "ties", "models": ["a"], "density": 0.0, "space": "core"},
         ["density=0.0: a share in (0, 1] of the entries to keep, e.g. 0.5"]),
    ]
    for rec, problems in cases:
        with pytest.raises(RecipeError) as e:
            Recipe.from_dict(rec)
        assert e.value.problems == problems


@pytest.mark.parametrize("space", ["full", "core"])
def test_one_model_is_pruned_as_peft_prunes_it(three, dense_updates, peft_mu, space):
    """Magnitude pruning of a single adapter (c, rank 6, rsLoRA) at density 0.3, written lossless: in full space
    PEFT's ``prune`` of its dense update, in core space the same in its principal bases (numpy's SVD); rtol 1e-6."""
    D = dense_updates(three / "c")
    merge(space, method="magnitude_prune", models=models("c", [0.5]), density=0.3, space=space, rank="exact")
    got = dense_updates(three / space)
    for m, d in D.items():
        if space == "full":
            want = 0.5 * peft_mu.prune(d, 0.3, "magnitude")
        else:
            U, V = principal([d])
            want = U @ (0.5 * peft_mu.prune(U.T @ d @ V, 0.3, "magnitude")) @ V.T
        assert rel(got[m], want) <= 1e-6, m
    assert json.loads((three / space / "vecmerge.json").read_text())["resolved"]["space"] == \
        {"full": "dense", "core": "core"}[space]
    assert verify_output(three / space)["passed"]


def test_full_space_without_kept_rows_writes_the_same_bytes(three, monkeypatch):
    """A module too large to keep its models' dense rows between the two passes (forced here by a zero budget)
    forms them again: the same operations on the same numbers, so the output is bit-identical."""
    import vecmerge.methods.elementwise as elementwise

    rec = dict(method="ties", models=models("abc", W3, [0.5, 0.3, 0.7]), space="full", rank="exact")
    merge("kept", **rec)
    monkeypatch.setattr(elementwise, "KEEP_BYTES", 0)
    merge("formed", **rec)
    sha = [json.loads((three / o / "vecmerge.json").read_text())["output"]["sha256"] for o in ("kept", "formed")]
    assert sha[0] == sha[1]


def test_a_nearly_cancelling_core_merge_keeps_the_rank_of_what_is_left(three, dense_updates):
    """a + b - (a + b + 1e-7 c) is -1e-7 c, of rank 6 = rank(c): the round-off of the cancelled parts (about 1e-16
    of the inputs, 1e-9 of the result) is not counted as rank, since the exact rank's threshold is relative to the
    inputs' scale, not only to the small result's. The written update is -1e-7 D_c to rtol 1e-6."""
    D = {n: dense_updates(three / n) for n in "abc"}
    rep = merge("near", method="magnitude_prune", models=models(["a", "b", "a + b + 1e-7 * c"], [1.0, 1.0, -1.0]),
                density=1.0, space="core", rank="exact")
    assert {e["rank"] for e in rep.outputs[0].figures["modules"].values()} == {6}
    assert_modules_close(dense_updates(three / "near"), {m: -1e-7 * d for m, d in D["c"].items()}, 1e-6)
    assert verify_output(three / "near")["passed"]


def test_principal_bases_are_numpys_singular_vectors_above_the_threshold():
    """``principal_bases`` against numpy's SVD of ``[X_1 .. X_n]`` and ``[X_1; ..; X_n]`` keeping singular values
    strictly above 1e-12 of the largest: the spans agree (projectors to 1e-10) on rank-deficient cores scaled by
    1e6 (round-off singular values ~1e-10 must not count), on one-row and one-column cores (rank-1 adapters), on
    an all-zero stack (no direction), and at the threshold itself (singular values 1 and 1e-12: one direction)."""
    from vecmerge.methods.elementwise import PRINCIPAL_RTOL, principal_bases

    g = torch.Generator().manual_seed(0)

    def rnd(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    L, R = rnd(5, 2), rnd(2, 4)
    stacks = [torch.stack([L @ rnd(2, 2) @ R for _ in range(3)]) * 1e6, rnd(2, 1, 3), rnd(2, 3, 1), rnd(3, 4, 2)]
    for X in stacks:
        U, V = principal_bases(X)
        Ur, Vr = principal(list(X), rtol=PRINCIPAL_RTOL)
        assert U.shape == Ur.shape and V.shape == Vr.shape, (tuple(X.shape), U.shape, Ur.shape)
        torch.testing.assert_close(U @ U.T, Ur @ Ur.T, rtol=0, atol=1e-10)
        torch.testing.assert_close(V @ V.T, Vr @ Vr.T, rtol=0, atol=1e-10)
    assert principal_bases(stacks[0])[0].shape == (5, 2)  # the rank of the updates, not the size of the core
    U, V = principal_bases(torch.zeros(2, 3, 4, dtype=torch.float64))
    assert U.shape == (3, 0) and V.shape == (4, 0)
    U, V = principal_bases(torch.diag(torch.tensor([1.0, 1e-12], dtype=torch.float64))[None])
    assert U.shape == (2, 1) and V.shape == (2, 1)
