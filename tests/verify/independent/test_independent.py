"""``verify``'s independent check: verify's own float64 derivation catches what a re-run of the pipeline cannot.

Tolerances: the dtype's ``update`` tolerance (fp32 1e-5) on the probe residual; the measured residual of a
clean fp32 output is ~0.6 u (3e-8), pinned below 2e-7. The tampering cases are those of issue 23: one factor
of a rank-cut fp32 output scaled by 1.0003 with the hash recomputed; a dose-ladder output that holds another
dose; a recorded cut error raised 1.5x; and a pipeline bug shared by the pipeline's own re-evaluation.
"""

import hashlib
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from vecmerge.testing import forge_tensor as rehashed
from vecmerge.testing import toy_adapter
from vecmerge.verify.checks.output import verify_output

CUT_MODULE = "model.layers.0.self_attn.q_proj"


def by_name(res) -> dict:
    return {c["name"]: c for c in res["checks"]}


def run_ok(run_cli, *args) -> None:
    res = run_cli(*args)
    assert res.exit_code == 0, res.output


@pytest.mark.parametrize("args", [
    ("project", "--base", "v54", "--dir", "v51-v28", "--trust", "0.0113"),
    ("project", "--base", "v54", "--dir", "v51-v28", "--trust", "0.0113", "--consensus-ref", "v54-v54e2",
     "--on-disagree", "drop", "--rank", "12"),
    ("project", "--base", "v54", "--dir", "v51-v28", "--trust", "0.02", "--trust-scope", "module"),
    ("project", "--base", "v54", "--dir", "v51-v28", "--trust", "0.0113", "--alpha", "5", "--mode", "orthogonal"),
    ("project", "--base", "v54", "--dir", "v51-v28", "--trust", "0.0113", "--mode", "onto-ref",
     "--consensus-ref", "v54-v54e2", "--on-disagree", "keep"),
    ("project", "--base", "v54", "--dir", "v51-v28", "--trust", "0.0113", "--only", "self_attn", "--dtype", "bf16"),
    ("refactor", "0.5*v51 + 0.5*v28", "--rank", "4"),
    ("refactor", "v51 - v28", "--rank", "energy:0.9", "--dtype", "fp16"),
    ("merge", "--method", "linear", "v51", "v28", "--weights", "0.3,0.7"),
    ("merge", "--method", "task_arithmetic", "v51", "v28", "--lambda", "0.5", "--normalize"),
    ("merge", "--method", "svd", "v51", "v54", "--rank", "6"),
    ("merge", "--method", "slerp", "v51", "v28", "--t", "0.3"),
    ("merge", "--method", "slerp", "v51", "v28", "--t", "0.7", "--slerp-scope", "global", "--rank", "6"),
    ("merge", "--method", "tsv_m", "r1", "r2", "r3", "--weights", "0.5,0.3,0.7"),
    ("merge", "--method", "tsv_m", "r1", "r2", "--sv-reduction", "0.1", "--lambda", "1.5", "--rank", "5"),
    ("merge", "--method", "iso_c", "v51", "v28", "v54"),
    ("merge", "--method", "iso_cts", "r1", "r2", "r3", "--common-space-fraction", "0.5", "--rank", "10"),
    ("merge", "--method", "svc", "v51", "v28", "v54", "--svc-alpha", "0.3", "--weights", "1,0.5,2"),
])
def test_clean_outputs_pass_the_independent_check(toy, run_cli, args):
    for i in (1, 2, 3):  # independent random adapters: the toy trajectory's share directions exactly, where
        toy_adapter(f"r{i}", rank=4, seed=10 + i, base_model="toy-base")  # TSV-M's polar factor is not unique
    run_ok(run_cli, *args, "--out", "out")
    res = verify_output("out")
    row = by_name(res).get("independent")
    assert row is not None and row["passed"], row
    assert res["passed"] and "not_independent" not in res
    dtype = json.loads(Path("out/vecmerge.json").read_text())["output"]["dtype"]
    limit = {"fp32": 2e-7, "fp16": 2e-3, "bf16": 1.5e-2}[dtype]  # ~0.6 u of the dtype; tolerances 1e-5/5e-3/3e-2
    assert row["figures"]["max_diff"] < limit and row["figures"]["modules"] == 14


def test_a_scale_of_1_0003_on_one_factor_of_a_cut_output_fails_the_independent_and_the_update_check(toy, run_cli,
                                                                                                   monkeypatch):
    """The hole of issue 23: a rank cut's error moves only to second order, so the recorded-error comparison of
    the re-run pipeline passed it; W = Q Q^T I does not hold any more, and both checks now test it (issue 36).
    By default the own path's row alone runs (it replaces update's): it fails alone."""
    run_ok(run_cli, "refactor", "0.5*v51 + 0.5*v28", "--rank", "4", "--out", "out")
    rehashed(Path("out"), f"{CUT_MODULE}.lora_B", lambda t: t * 1.0003)
    assert [c["name"] for c in verify_output("out")["checks"] if not c["passed"]] == ["independent"]
    monkeypatch.setattr("vecmerge.verify.checks.output.own_path_compared", lambda rows: False)  # pipeline's too
    res = by_name(verify_output("out"))
    assert [n for n, c in res.items() if not c["passed"]] == ["update", "independent"]
    assert CUT_MODULE in res["independent"]["detail"] and CUT_MODULE in res["update"]["detail"]
    assert res["independent"]["figures"]["max_diff"] == pytest.approx(3e-4, rel=0.5)
    assert res["update"]["figures"]["max_projected"] == pytest.approx(3e-4, rel=0.5)


@pytest.mark.parametrize("factor, passes, why", [
    (1 + 3e-5, False, "do not hold the intended update"),  # over the probe tolerance 1e-5
    (1 + 1e-6, False, "the recorded write error differs"),  # under it, but the module's error is no longer its own
    (1 + 2 ** -23, True, None),  # one float32 ulp of every entry: within round-off of the recorded error
])
def test_the_independent_tolerance_is_sharp_on_both_sides(toy, run_cli, factor, passes, why):
    """A lossless fp32 output: one module moved by 3e-5 fails the probes, by 1e-6 fails its recorded write error
    (about 3.5e-8: the stranger's 0.01% edit of one entry), by one ulp passes."""
    run_ok(run_cli, "project", "--base", "v54", "--dir", "v51-v28", "--trust", "0.0113", "--out", "out")
    rehashed(Path("out"), f"{CUT_MODULE}.lora_B", lambda t: t * factor)
    row = by_name(verify_output("out"))["independent"]
    assert row["passed"] is passes, row["detail"]
    assert why is None or why in row["detail"]
    assert row["figures"]["max_diff"] == pytest.approx(factor - 1, rel=0.6, abs=2e-7)


def test_a_recorded_cut_error_raised_1_5x_fails(toy, run_cli):
    run_ok(run_cli, "refactor", "0.5*v51 + 0.5*v28", "--rank", "4", "--out", "out")
    man = json.loads(Path("out/vecmerge.json").read_text())
    man["modules"][CUT_MODULE]["rel_error"] *= 1.5
    Path("out/vecmerge.json").write_text(json.dumps(man, indent=2))
    row = by_name(verify_output("out"))["independent"]
    assert not row["passed"] and "recorded cut error" in row["detail"] and CUT_MODULE in row["detail"]


def test_a_dose_ladder_output_that_holds_another_dose_fails(toy, run_cli):
    run_ok(run_cli, "project", "--base", "v54", "--dir", "v51-v28", "--trust", "0.0113", "--dose", "0.5,1",
           "--out", "out")
    out = Path("out-x0.5")
    (out / "adapter_model.safetensors").write_bytes(Path("out-x1/adapter_model.safetensors").read_bytes())
    man = json.loads((out / "vecmerge.json").read_text())
    man["output"]["sha256"] = hashlib.sha256((out / "adapter_model.safetensors").read_bytes()).hexdigest()
    (out / "vecmerge.json").write_text(json.dumps(man, indent=2))
    row = by_name(verify_output(out))["independent"]
    assert not row["passed"] and "survival 2.0000" in row["detail"]  # the 1x step measured against the 0.5x one


def test_a_pipeline_bug_that_drops_the_dose_is_caught_though_the_pipelines_own_recheck_passes(toy, run_cli,
                                                                                            monkeypatch):
    """The dose ladder of issue 23: the pipeline writes the 1x step under every dose (a bug in code that
    ``verify``'s re-evaluation shares), so update, step, figures and manifest pass; the independent check,
    which measures the dose outside the pipeline, fails."""
    import vecmerge.pipeline.build as build
    import vecmerge.verify.checks.update as update

    real = build.intended_core

    def one_x(ev, m, multiple):
        return real(ev, m, 1.0)

    monkeypatch.setattr(build, "intended_core", one_x)
    monkeypatch.setattr(update, "intended_core", one_x)
    monkeypatch.setattr("vecmerge.verify.checks.output.own_path_compared", lambda rows: False)  # run both paths
    run_ok(run_cli, "project", "--base", "v54", "--dir", "v51-v28", "--trust", "0.0113", "--dose", "0.5,2",
           "--out", "out")
    for out, dose in (("out-x0.5", 0.5), ("out-x2", 2.0)):
        res = by_name(verify_output(out))
        assert res["update"]["passed"] and res["step"]["passed"]  # the shared bug hides itself
        row = res["independent"]
        assert not row["passed"], out
        assert row["figures"]["survival"] == pytest.approx(1 / dose, rel=1e-6)  # the 1x step, measured


def test_an_edited_alpha_or_drop_list_fails(toy, run_cli):
    run_ok(run_cli, "project", "--base", "v54", "--dir", "v51-v28", "--trust", "0.0113", "--consensus-ref",
           "v54-v54e2", "--on-disagree", "drop", "--out", "out")
    man = json.loads(Path("out/vecmerge.json").read_text())
    man["resolved"]["dropped_by_consensus"] = [CUT_MODULE]
    Path("out/vecmerge.json").write_text(json.dumps(man, indent=2))
    row = by_name(verify_output("out"))["independent"]
    assert not row["passed"] and "dropped_by_consensus" in row["detail"]


def test_a_recipe_outside_verify_s_own_path_is_named_not_passed_silently(toy, run_cli):
    """TSV-M of checkpoints that repeat factors exactly: its polar factor is not unique, so not re-derived."""
    run_ok(run_cli, "merge", "--method", "tsv_m", "v51", "v28", "--out", "out")
    res = verify_output("out")
    assert "independent" not in by_name(res) and res["passed"]
    assert "polar factor is not unique" in res["not_independent"]
    text = " ".join(run_cli("verify", "out").stdout.split())
    assert "note: the update was not re-derived by verify's own path (the models' singular vectors" in text


def test_the_independent_check_reads_bf16_outputs_itself(toy, run_cli):
    """bf16 decoded by numpy (the top 16 bits of a float32) equals torch's reading."""
    from vecmerge.verify.independent.lora_terms import read_folder

    run_ok(run_cli, "project", "--base", "v54", "--dir", "v51-v28", "--trust", "0.0113", "--dtype", "bf16",
           "--out", "out")
    folder = read_folder(Path("out"))
    key = next(k for k in folder.keys)
    B, A = folder.factors(key)
    folder.close()
    raw = load_file("out/adapter_model.safetensors")
    a_torch = raw[f"base_model.model.{key}.lora_A.weight"].to(torch.float64).numpy()
    assert (A == a_torch).all()
    assert B.dtype.name == "float64"


def test_an_edited_spectral_parameter_fails(toy, run_cli):
    """SVC's alpha changed in the manifest: verify's own formula gives another update than the one written."""
    run_ok(run_cli, "merge", "--method", "svc", "v51", "v28", "v54", "--svc-alpha", "0.3", "--out", "out")
    man = json.loads(Path("out/vecmerge.json").read_text())
    man["recipe"]["svc_alpha"] = 0.9
    Path("out/vecmerge.json").write_text(json.dumps(man, indent=2))
    row = by_name(verify_output("out"))["independent"]
    assert not row["passed"] and "do not hold the intended update" in row["detail"]


def test_a_merge_whose_polar_factor_is_not_unique_is_named_not_judged(toy, run_cli):
    """The toy trajectory's adapters share singular directions exactly: TSV-M's polar factor is then any
    completion, so verify says it cannot re-derive the update instead of failing a correct output."""
    run_ok(run_cli, "merge", "--method", "tsv_m", "v51", "v28", "--out", "out")
    res = verify_output("out")
    assert res["passed"] and "independent" not in by_name(res)
    assert "polar factor is not unique" in res["not_independent"]


def test_a_keep_base_output_is_re_derived_by_verifys_own_path(toy, run_cli):
    """Issue 36: rank keep-base (the backbone's factors kept, the step's exact factors appended) is lossless, so
    verify's own path compares W with I = base + alpha dir directly (it was 'not independent'): clean within fp32
    round-off (2e-7), and one module's B times 1 + 1e-4 (re-pinned) fails the independent row by name at ~1e-4."""
    run_ok(run_cli, "project", "--base", "v54", "--dir", "v51-v28", "--trust", "0.05", "--rank", "keep-base",
           "--out", "out")
    res = verify_output("out")
    row = by_name(res)["independent"]
    assert res["passed"] and "not_independent" not in res and row["figures"]["max_diff"] < 2e-7
    rehashed(Path("out"), f"{CUT_MODULE}.lora_B", lambda t: t * (1 + 1e-4))
    row = by_name(verify_output("out"))["independent"]
    assert not row["passed"] and CUT_MODULE in row["detail"]
    assert row["figures"]["max_diff"] == pytest.approx(1e-4, rel=0.5)


def _with_biases(root: Path, names=("v54", "v51", "v28")) -> dict:
    """The toy's adapters made lora_bias adapters: a random ``lora_B.bias`` per module; returns their biases."""
    from safetensors.torch import save_file

    g, biases = torch.Generator().manual_seed(5), {}
    for n in names:
        t = load_file(str(root / n / "adapter_model.safetensors"))
        for k in [k for k in t if k.endswith("lora_B.weight")]:
            t[k[:-len("weight")] + "bias"] = biases[(n, k)] = torch.randn(t[k].shape[0], generator=g) * 0.01
        save_file(t, str(root / n / "adapter_model.safetensors"), metadata={"format": "pt"})
        cfg = json.loads((root / n / "adapter_config.json").read_text())
        (root / n / "adapter_config.json").write_text(json.dumps({**cfg, "lora_bias": True}))
    return biases


@pytest.mark.parametrize("args", [("merge", "--method", "linear", "v54", "v51", "--weights", "0.6,0.4"),
                                  ("project", "--base", "v54", "--dir", "v51-v28", "--trust", "0.05")])
def test_lora_bias_inputs_are_re_derived_by_verify_s_own_path(toy, run_cli, args):
    """The own path reads ``lora_B.bias`` (issue 36's mutant: it never did, yet claimed the update re-derived): the
    intended bias equals the inputs' biases combined here by hand (rel 1e-12), and a re-pinned 0.01% edit of one
    module's written bias fails the independent row itself (the weights are untouched)."""
    from vecmerge.recipe.load import with_absolute_inputs
    from vecmerge.verify.independent.derive import derive

    biases = _with_biases(toy)
    run_ok(run_cli, *args, "--out", "out")
    res = by_name(verify_output("out"))
    assert res["independent"]["passed"] and "lora_bias bias updates of 14 modules" in res["independent"]["detail"]
    man = with_absolute_inputs(json.loads(Path("out/vecmerge.json").read_text()), Path("out"))
    d = derive(man)
    key = f"base_model.model.{CUT_MODULE}.lora_B.weight"
    b54, b51, b28 = (biases[(n, key)].double().numpy() for n in ("v54", "v51", "v28"))  # toy scale alpha/r = 1
    want = 0.6 * b54 + 0.4 * b51 if args[0] == "merge" else b54 + d.module_alpha[CUT_MODULE] * (b51 - b28)
    got = d.intended_bias(CUT_MODULE)
    d.close()
    assert float(((got - want) ** 2).sum() ** 0.5) <= 1e-12 * float((want ** 2).sum() ** 0.5)
    rehashed(Path("out"), f"{CUT_MODULE}.lora_B.bias", lambda t: t * (1 + 1e-4))
    row = by_name(verify_output("out"))["independent"]
    assert not row["passed"] and "intended bias update" in row["detail"] and CUT_MODULE in row["detail"]


@pytest.mark.parametrize("cut, tilt, passes", [("full", 0.005, False), ("randomized", 0.005, True),
                                               ("randomized", 0.2, False)])
def test_a_range_finder_cut_may_be_near_optimal_not_exactly(toy, run_cli, cut, tilt, passes):
    """A rank-8 cut ``W = Q Q^T I`` on a subspace tilted away from the top singular vectors: still the projection
    of I (the first-order check passes), its error a little above the optimal one. Recorded ``cut: full`` must be
    optimal (within tol); ``cut: randomized`` (a dense-space merge's range finder) within 1% of the optimum."""
    import numpy as np
    from safetensors.torch import save_file

    from vecmerge.outputs.manifest import TOLERANCES
    from vecmerge.recipe.load import with_absolute_inputs
    from vecmerge.verify.independent.derive import derive
    from vecmerge.verify.independent.independent import independent_check
    from vecmerge.verify.independent.lora_terms import read_folder

    run_ok(run_cli, "merge", "--method", "ties", "v54", "v51", "--density", "0.5", "--rank", "8", "--out", "out")
    man = with_absolute_inputs(json.loads(Path("out/vecmerge.json").read_text()), Path("out"))
    d = derive(man)
    intended = d.intended(CUT_MODULE)[0].dense()
    d.close()
    U, S, _ = np.linalg.svd(intended)
    Q = np.linalg.qr(U[:, :8] + tilt * U[:, 8:16] @ np.random.default_rng(0).standard_normal((8, 8)))[0]
    tensors = load_file("out/adapter_model.safetensors")
    key = f"base_model.model.{CUT_MODULE}.lora_"
    folder = read_folder(Path("out"))  # the output's scale alpha / r, folded into lora_A
    scale = folder.scale(CUT_MODULE)
    folder.close()
    tensors[key + "B.weight"] = torch.from_numpy(Q).float().contiguous()
    tensors[key + "A.weight"] = torch.from_numpy(Q.T @ intended / scale).float().contiguous()
    save_file(tensors, "out/adapter_model.safetensors", metadata={"format": "pt"})
    err = float(np.linalg.norm(intended - Q @ (Q.T @ intended)) / np.linalg.norm(intended))
    optimal = float(np.sqrt((S[8:] ** 2).sum()) / np.linalg.norm(intended))
    assert optimal * (1 + 1e-6) < err and (err < optimal * 1.01) == (tilt < 0.1), (err, optimal)
    man["modules"][CUT_MODULE] = {**man["modules"][CUT_MODULE], "rel_error": err, "cut": cut}
    row = independent_check(Path("out"), man, TOLERANCES["fp32"])
    assert row["passed"] is passes, row["detail"]
    if not passes:
        assert "not an optimal cut for their rank" in row["detail"] and CUT_MODULE in row["detail"]
