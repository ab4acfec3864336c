"""``vecmerge verify``: a clean output passes; every way an upload can go wrong fails with exit 1, by name.

Tolerances (see ``vecmerge.verify.checks.output``): the written update must equal the recomputed one within 1e-5
(fp32), 5e-3 (fp16), 3e-2 (bf16) relative Frobenius; the measured errors are ~0.6 u of the dtype
(fp32 ~4e-8), which these tests also pin so that the tolerances keep a wide margin. Tampering is
done at 10x the fp32 tolerance (one tensor scaled by 1 + 1e-4) to show the check is that sharp.
"""

import json
import math
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from vecmerge.errors import OutputError
from vecmerge.peft.adapter import Adapter
from vecmerge.testing import assert_merge_identity, toy_adapter, write_peft_folder
from vecmerge.verify.checks.output import TOLERANCES, verify_identities, verify_output

MODULE = "model.layers.1.self_attn.v_proj"
B_KEY = f"base_model.model.{MODULE}.lora_B.weight"


def project(run_cli, out="out", *extra, base="v54", direction="v51-v28", trust="0.0113") -> Path:
    res = run_cli("project", "--base", base, "--dir", direction, "--trust", trust, "--out", out, *extra)
    assert res.exit_code == 0, res.output
    return Path(out)


def rewrite_tensor(folder: Path, key: str, fn) -> None:
    """Rewrite ``folder``'s safetensors with ``key`` replaced by ``fn(tensor)``."""
    path = folder / "adapter_model.safetensors"
    tensors = load_file(path)
    tensors[key] = fn(tensors[key].clone())
    save_file(tensors, path, metadata={"format": "pt"})


def failed(res) -> list[str]:
    return [c["name"] for c in json.loads(res.stdout)["checks"] if not c["passed"]]


def by_name(result: dict) -> dict:
    return {c["name"]: c for c in result["checks"]}


@pytest.fixture(autouse=True)
def pipeline_update_check(request, monkeypatch):
    """These tests pin the pipeline's ``update``/``step``/``bias`` rows, which verify runs for a recipe its own
    path does not cover (and with --base-model on a lossless output): force them on covered recipes too. The
    default (the own path's row replacing them) is tested by the tests that take the ``own_path`` fixture."""
    if "own_path" not in request.fixturenames:
        monkeypatch.setattr("vecmerge.verify.checks.output.own_path_compared", lambda rows: False)


@pytest.fixture
def own_path():
    """Marks a test of verify's default path: the pipeline's update check is skipped where the own path compared."""


# -- a clean output ---------------------------------------------------------------------------------
def test_clean_output_passes_and_json_shape(toy, run_cli):
    project(run_cli)
    res = run_cli("verify", "out")
    assert res.exit_code == 0, res.output
    assert "PASSED: all" in res.stdout and "FAIL" not in res.stdout
    data = json.loads(run_cli("verify", "out", "--json").stdout)
    assert set(data) >= {"target", "passed", "checks"} and data["passed"] is True and data["target"] == "out"
    for c in data["checks"]:
        assert set(c) == {"name", "passed", "detail", "figures"}
        assert isinstance(c["name"], str) and c["passed"] is True and isinstance(c["detail"], str)
        assert isinstance(c["figures"], dict)
    checks = {c["name"]: c for c in data["checks"]}
    assert list(checks) == ["inputs", "recompute", "output opens", "output sha256", "finite", "files", "config",
                            "key set", "ranks and scales", "update", "step", "figures", "independent", "manifest"]
    man = json.loads(Path("out/vecmerge.json").read_text())
    assert checks["recompute"]["figures"]["alpha"] == man["resolved"]["alpha"]  # to the last bit
    assert checks["update"]["figures"]["max_rel_error"] < 2e-7                  # ~0.6 u of fp32, tol 1e-5
    assert checks["step"]["figures"]["survival"] == pytest.approx(1.0, abs=1e-6)
    assert checks["output sha256"]["figures"]["sha256"] == man["output"]["sha256"]


def test_a_covered_recipe_is_checked_by_verifys_own_path_alone(toy, run_cli, own_path, dense_expr, dense_updates):
    """Default path: no pipeline update/step row; the independent row carries the survival, which equals the
    dense float64 one, sum_m <W_m - base_m, alpha dir_m> / ||alpha dir||^2 (rel 1e-9)."""
    project(run_cli)
    res = verify_output("out")
    assert res["passed"], [c for c in res["checks"] if not c["passed"]]
    checks = by_name(res)
    assert list(checks) == ["inputs", "recompute", "output opens", "output sha256", "finite", "files", "config",
                            "key set", "ranks and scales", "figures", "independent", "manifest"]
    base, d = dense_expr({"v54": 1.0}), dense_expr({"v51": 1.0, "v28": -1.0})
    fro = lambda x: math.sqrt(sum(float((t**2).sum()) for t in x.values()))  # noqa: E731
    alpha = 0.0113 * fro(base) / fro(d)
    written = dense_updates(Path("out"))
    surv = sum(float(((written[m] - base[m]) * alpha * d[m]).sum()) for m in base) / (alpha**2 * fro(d) ** 2)
    assert checks["independent"]["figures"]["survival"] == pytest.approx(surv, rel=1e-9)
    assert "verify's own float64 path" in checks["independent"]["detail"]


@pytest.mark.parametrize("factor", [1 + 1e-4, 1 + 3e-5])
def test_a_changed_tensor_of_a_covered_recipe_fails_the_own_paths_row(toy, run_cli, own_path, factor):
    """The row that replaces the pipeline's update check catches what it caught: 3x and 10x fp32's 1e-5."""
    project(run_cli)
    rewrite_tensor(Path("out"), B_KEY, lambda t: t * factor)
    res = by_name(verify_output("out"))
    assert "update" not in res and "step" not in res
    assert res["independent"]["passed"] is False and MODULE in res["independent"]["detail"]
    assert not res["output sha256"]["passed"]


def test_verify_hashes_each_file_once(toy, run_cli, own_path, monkeypatch):
    """The inputs check and the output check hash every file; verify's own path reuses those digests."""
    from vecmerge.io.safetensors_read import TensorFile

    project(run_cli)
    seen: list = []
    real = TensorFile.sha256
    monkeypatch.setattr(TensorFile, "sha256", lambda self: seen.append(self.path) or real(self))
    assert verify_output("out")["passed"]
    assert seen == []


def test_verify_figures_against_an_independent_dense_computation(toy, run_cli, dense_expr, dense_updates):
    """verify recomputes through the pipeline; here the same figures come from dense float64 of the raw files:
    alpha = T ||base|| / ||dir||, I_m = base_m + alpha dir_m, rel_error_m = ||W_m - I_m|| / ||I_m||."""
    project(run_cli, "out", "--dtype", "bf16")
    base, d = dense_expr({"v54": 1.0}), dense_expr({"v51": 1.0, "v28": -1.0})
    fro = lambda x: math.sqrt(sum(float((t**2).sum()) for t in x.values()))  # noqa: E731
    alpha = 0.0113 * fro(base) / fro(d)
    written = dense_updates(Path("out"))
    errs = {m: float((written[m] - (base[m] + alpha * d[m])).norm() / (base[m] + alpha * d[m]).norm()) for m in base}
    res = by_name(verify_output("out"))
    assert res["recompute"]["figures"]["alpha"] == pytest.approx(alpha, rel=1e-12)
    upd = res["update"]["figures"]
    assert upd["worst_module"] == max(errs, key=errs.get)
    assert upd["max_rel_error"] == pytest.approx(max(errs.values()), rel=1e-6)
    assert 1e-4 < upd["max_rel_error"] < TOLERANCES["bf16"]["update"]  # bf16 rounding is real, and inside the bound
    step_sq = alpha**2 * fro(d) ** 2
    surv = sum(float(((written[m] - base[m]) * alpha * d[m]).sum()) for m in base) / step_sq
    assert res["step"]["figures"]["survival"] == pytest.approx(surv, rel=1e-9)


@pytest.mark.parametrize("flags", [("--dtype", "bf16"), ("--dtype", "fp16"), ("--rank", "4"),
                                   ("--trust-scope", "module"), ("--rank", "keep-base"),
                                   ("--consensus-ref", "v54-v54e2", "--mode", "onto-ref")])
def test_output_variants_pass(toy, run_cli, flags):
    project(run_cli, "out", *flags)
    res = verify_output("out")
    assert res["passed"], [c for c in res["checks"] if not c["passed"]]
    dtype = flags[1] if flags[0] == "--dtype" else "fp32"
    update = by_name(res)["update"]["figures"]
    assert res["dtype"] == dtype and update["tolerance"] == TOLERANCES[dtype]["update"]
    if flags[:2] != ("--rank", "4"):  # a rank cut is compared with its recorded error instead
        assert update["max_rel_error"] < TOLERANCES[dtype]["update"] / 5  # the tolerance has margin


def test_dose_ladder_and_refactor_outputs_pass(toy, run_cli):
    project(run_cli, "out", "--dose", "0.5,1.456")
    res = run_cli("refactor", "0.5*v28 + 0.5*v51", "--rank", "4", "--out", "avg")
    assert res.exit_code == 0, res.output
    for out in ("out-x0.5", "out-x1.456", "avg"):
        assert verify_output(out)["passed"], out
    assert "step" not in by_name(verify_output("avg"))  # a refactor has no step
    assert_merge_identity("out-x1.456")


# -- everything that must fail, by name ---------------------------------------------------------------
def test_one_changed_tensor_fails(toy, run_cli):
    project(run_cli)
    rewrite_tensor(Path("out"), B_KEY, lambda t: t * (1 + 1e-4))  # 10x the fp32 tolerance
    res = run_cli("verify", "out", "--json")
    assert res.exit_code == 1
    assert failed(res)[:2] == ["output sha256", "update"]
    text = run_cli("verify", "out").stdout.replace("\n", " ")
    detail = by_name(verify_output("out"))["update"]
    assert detail["figures"]["bad_modules"] == [MODULE]
    assert detail["figures"]["max_rel_error"] == pytest.approx(1e-4, rel=1e-3)
    assert "adapter_model.safetensors" in detail["detail"] and MODULE in detail["detail"]
    assert "the weights changed after writing" in " ".join(text.split())


@pytest.mark.parametrize("factor, passes", [(1 + 3e-5, False), (1 + 3e-6, True)])
def test_update_tolerance_is_sharp_on_both_sides(toy, run_cli, factor, passes):
    """fp32 tolerance 1e-5: a module moved by 3e-5 of its norm fails, one moved by 3e-6 passes the update check
    (the hash check fails either way)."""
    project(run_cli)
    rewrite_tensor(Path("out"), B_KEY, lambda t: t * factor)
    res = by_name(verify_output("out"))
    assert res["update"]["passed"] is passes and not res["output sha256"]["passed"]
    assert res["update"]["figures"]["max_rel_error"] == pytest.approx(factor - 1, rel=0.05)


def test_a_halved_step_in_one_module_fails_the_step_check(toy, run_cli):
    """W_m = base_m + step_m / 2 in one module: survival drops below 1 by that module's share of the step
    energy / 2 (computed here), far beyond 1e-4, and the step check itself fails."""
    from vecmerge.linalg.rank_policy import RankPolicy
    from vecmerge.linalg.rankcut import cut
    from vecmerge.pipeline import evaluate, intended_core
    from vecmerge.recipe.recipe import Recipe
    from vecmerge.workspace.names import Workspace

    project(run_cli)
    ev = evaluate(Recipe.from_dict(json.loads(Path("out/vecmerge.json").read_text())["recipe"]), Workspace())
    target, step = intended_core(ev, MODULE, 1.0)
    out = Adapter(Path("out"))
    half = cut(target - step * 0.5, RankPolicy("fixed", out.specs[MODULE].rank)).factors
    scale = out.specs[MODULE].scale
    a_key = B_KEY.replace("lora_B", "lora_A")
    rewrite_tensor(Path("out"), B_KEY, lambda t: (half.B * half.scale / scale).to(t.dtype))
    rewrite_tensor(Path("out"), a_key, lambda t: half.A.to(t.dtype))
    share = step.norm() ** 2 / sum(ev.direction[m].norm() ** 2 * ev.step.module_alpha[m] ** 2 for m in ev.names)
    res = by_name(verify_output("out"))
    assert not res["step"]["passed"]
    assert res["step"]["figures"]["survival"] == pytest.approx(1 - share / 2, rel=1e-5)


def test_edited_lora_alpha_fails(toy, run_cli):
    project(run_cli)
    cfg_path = Path("out/adapter_config.json")
    cfg = json.loads(cfg_path.read_text())
    cfg["lora_alpha"] *= 2
    cfg_path.write_text(json.dumps(cfg))
    res = run_cli("verify", "out", "--json")
    assert res.exit_code == 1 and failed(res)[:2] == ["output sha256", "update"]
    checks = by_name(json.loads(res.stdout))
    assert "the config was edited after writing" in checks["output sha256"]["detail"]
    upd = checks["update"]
    first = upd["figures"]["bad_modules"][0]
    assert upd["detail"] == (f"14/14 modules differ from the recomputed update, e.g. {first}: relative error "
                             "1.000e+00 > 1e-05; the update is scaled by 2: the scale PEFT applies (lora_alpha, r, "
                             "alpha_pattern in adapter_config.json) changed")
    assert "check(s) failed: output sha256, update" in run_cli("verify", "out").stderr


def test_input_changed_after_merge_fails(toy, run_cli):
    project(run_cli)
    key = sorted(load_file(toy / "v28" / "adapter_model.safetensors"))[0]
    rewrite_tensor(toy / "v28", key, lambda t: t * 1.01)
    res = run_cli("verify", "out", "--json")
    assert res.exit_code == 1 and failed(res) == ["inputs", "recompute", "update", "figures", "independent", "manifest"]
    detail = by_name(json.loads(res.stdout))["inputs"]["detail"]
    assert detail.startswith("input v28: ") and "it changed after the merge" in detail
    assert "input v28" in run_cli("verify", "out").stdout


def test_input_config_changed_fails(toy, run_cli):
    project(run_cli)
    cfg = json.loads((toy / "v51" / "adapter_config.json").read_text())
    cfg["lora_alpha"] = 3.0  # same weights, another scale: the update changed
    (toy / "v51" / "adapter_config.json").write_text(json.dumps(cfg))
    res = run_cli("verify", "out", "--json")
    assert res.exit_code == 1 and "inputs" in failed(res)
    assert "input v51" in by_name(json.loads(res.stdout))["inputs"]["detail"]


def test_missing_input_fails(toy, run_cli):
    project(run_cli)
    shutil.rmtree(toy / "v51")
    res = run_cli("verify", "out", "--json")
    assert res.exit_code == 1 and failed(res)[0] == "inputs"
    detail = by_name(json.loads(res.stdout))["inputs"]["detail"]
    assert "input v51 is missing or unreadable" in detail and str(toy / "v51") in detail


def test_corrupt_output_fails_naming_the_file(toy, run_cli):
    project(run_cli)
    weights = Path("out/adapter_model.safetensors")
    weights.write_bytes(weights.read_bytes()[:1000])
    res = run_cli("verify", "out", "--json")
    assert res.exit_code == 1 and failed(res) == ["output opens", "update", "figures", "independent"]
    detail = by_name(json.loads(res.stdout))["output opens"]["detail"]
    assert "out/adapter_model.safetensors" in detail and "truncated or corrupt" in detail


def test_nan_in_output_fails(toy, run_cli):
    project(run_cli)
    rewrite_tensor(Path("out"), B_KEY, lambda t: t.index_put_((torch.tensor([0]), torch.tensor([0])),
                                                               torch.tensor(float("nan"))))
    checks = by_name(verify_output("out"))
    assert not checks["finite"]["passed"] and MODULE in checks["finite"]["detail"]


def test_edited_manifest_alpha_fails(toy, run_cli):
    project(run_cli)
    man_path = Path("out/vecmerge.json")
    man = json.loads(man_path.read_text())
    man["resolved"]["alpha"] = math.nextafter(man["resolved"]["alpha"], 1.0) * (1 + 1e-6)
    man_path.write_text(json.dumps(man))
    res = run_cli("verify", "out", "--json")
    assert res.exit_code == 1 and failed(res) == ["recompute", "independent", "manifest"]
    assert "alpha recomputes to" in by_name(json.loads(res.stdout))["recompute"]["detail"]
    assert "resolved.alpha is" in by_name(json.loads(res.stdout))["manifest"]["detail"]


def test_missing_manifest_is_a_usage_error(toy, run_cli):
    project(run_cli)
    Path("out/vecmerge.json").unlink()
    res = run_cli("verify", "out")
    assert res.exit_code == 2 and "no vecmerge.json" in res.stderr and "--identities" in res.stderr
    with pytest.raises(OutputError):
        verify_output("out")


def test_assert_merge_identity_lists_failed_checks(toy, run_cli):
    project(run_cli)
    assert_merge_identity("out")
    rewrite_tensor(Path("out"), B_KEY, lambda t: t * 2)
    with pytest.raises(AssertionError, match=r"4 verify check\(s\) failed:\n  output sha256: .*\n  update: "):
        assert_merge_identity("out")


# -- identities of adapters without a manifest ----------------------------------------------------------
def test_identities_pass_and_json_shape(toy, run_cli):
    res = run_cli("verify", "--identities", "v54", "v51", "--json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["passed"] is True and data["kind"] == "identities" and len(data["adapters"]) == 2
    names = [c["name"] for c in data["checks"]]
    for law in ("||x||^2 = <x,x>", "x - x = 0", "(a + b) - b = a", "exact refactor", "scale rule",
                "dense = factored"):
        assert f"{law} [v54]" in names and f"{law} [v51]" in names
    for c in data["checks"]:
        if "max_rel_error" in c["figures"]:
            assert c["figures"]["max_rel_error"] <= c["figures"]["tolerance"] / 1e3  # float64: ~1e-15
    one = verify_identities([Adapter(toy / "v54")])
    assert one["passed"] and "b = 2*v54" in by_name(one)["(a + b) - b = a [v54]"]["detail"]
    assert "PASSED" in run_cli("verify", "--identities", "v54").stdout


def test_identities_scale_rule_with_patterns(tmp_path):
    path = toy_adapter(tmp_path / "pat", rank=4, rslora=True, rank_pattern={"layers.0.mlp.up_proj": 2},
                       alpha_pattern={"o_proj": 3.0, "no_such_module": 5.0})
    # toy_adapter writes rank 4 everywhere; re-save with the up_proj factors at rank 2 so r resolves
    t = load_file(path / "adapter_model.safetensors")
    for k in list(t):
        if "layers.0.mlp.up_proj" in k:
            t[k] = (t[k][:2] if "lora_A" in k else t[k][:, :2]).contiguous()
    save_file(t, path / "adapter_model.safetensors", metadata={"format": "pt"})
    res = verify_identities([Adapter(path)])
    assert res["passed"], [c for c in res["checks"] if not c["passed"]]
    rule = by_name(res)["scale rule [pat]"]
    assert rule["figures"]["rule"] == "alpha/sqrt(r) (rsLoRA)"
    assert rule["figures"]["unused_pattern_keys"] == ["no_such_module"]


def test_identities_fail_on_nan(tmp_path, run_cli):
    B, A = torch.randn(8, 2), torch.randn(2, 8)
    B[3, 1] = float("inf")
    path = write_peft_folder(tmp_path / "bad", {"model.layers.0.mlp.up_proj": (B, A)}, r=2, lora_alpha=4)
    res = run_cli("verify", "--identities", str(path), "--json")
    assert res.exit_code == 1 and failed(res) == ["finite [bad]"]
    assert "model.layers.0.mlp.up_proj: lora_B has 1 NaN/Inf" in res.stdout


# -- the real client: PEFT on a tiny Qwen3 ---------------------------------------------------------------
@pytest.fixture
def real_workspace(peft_adapter, tmp_path, monkeypatch):
    names = {"A": peft_adapter("verify_A", seed=11), "B": peft_adapter("verify_B", seed=12),
             "C": peft_adapter("verify_C", seed=13)}
    (tmp_path / "vecmerge.yaml").write_text("adapters:\n" + "".join(f"  {k}: {v}\n" for k, v in names.items()))
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.slow
def test_real_model_load_passes(real_workspace, tiny_base, run_cli):
    project(run_cli, "out", base="A", direction="B-C", trust="0.01")
    project(run_cli, "out16", "--dtype", "bf16", base="A", direction="B-C", trust="0.01")
    res = run_cli("verify", "out", "--base-model", tiny_base, "--json")
    assert res.exit_code == 0, res.output
    checks = by_name(json.loads(res.stdout))
    for name in ("peft load", "peft modules", "peft delta", "logits", "logits vs intended", "merge_and_unload"):
        assert checks[name]["passed"], checks[name]
    assert checks["peft delta"]["figures"]["max_rel_error"] < 1e-6         # PEFT's float32 B@A, tol 1e-5
    assert checks["logits"]["figures"]["rel_max_diff"] < 1e-5              # two float32 forwards, tol 1e-4
    assert checks["logits"]["figures"]["adapter_effect"] > 1e-2            # the adapter moves the logits
    assert checks["merge_and_unload"]["figures"]["max_rel_error"] < 5e-7   # tol 1e-6
    bf = verify_output("out16", base_model=tiny_base)
    assert bf["passed"], [c for c in bf["checks"] if not c["passed"]]


@pytest.mark.slow
def test_real_model_catches_a_changed_module(real_workspace, tiny_base, run_cli):
    project(run_cli, "out", base="A", direction="B-C", trust="0.01")
    rewrite_tensor(Path("out"), B_KEY, lambda t: t * 1.5)
    res = run_cli("verify", "out", "--base-model", tiny_base, "--json")
    assert res.exit_code == 1
    assert failed(res) == ["output sha256", "update", "step", "independent", "logits vs intended"]
    checks = by_name(json.loads(res.stdout))
    assert checks["peft delta"]["passed"]  # PEFT and we read the same (changed) file alike


@pytest.mark.slow
def test_verify_with_base_model_on_embedding_lora(tiny_base, peft_adapter, run_cli, tmp_path, monkeypatch):
    a = peft_adapter("rv_emb", seed=5, target_modules=["q_proj", "embed_tokens"])
    monkeypatch.chdir(tmp_path)
    (tmp_path / "vecmerge.yaml").write_text(f"adapters:\n  e: {a}\n")
    assert run_cli("refactor", "0.5*e", "--out", "o").exit_code == 0
    res = run_cli("verify", "o", "--base-model", tiny_base)
    assert res.exit_code == 0, res.output
    assert "PASSED" in res.output


def test_identities_use_the_names_the_user_typed(tmp_path, monkeypatch, run_cli):
    """Issue 12 item 13: workspace names label the checks, not the folders' names."""
    toy_adapter(tmp_path / "runs" / "ck1")
    toy_adapter(tmp_path / "runs" / "ck3", seed=1)
    (tmp_path / "vecmerge.yaml").write_text("adapters: {p1: runs/ck1, p3: runs/ck3}\n")
    monkeypatch.chdir(tmp_path)
    data = json.loads(run_cli("verify", "--identities", "p1", "p3", "p3", "--json").stdout)
    assert data["target"] == "p1; p3; p3"
    labels = {c["name"].split("[", 1)[1].rstrip("]") for c in data["checks"]}
    assert labels == {"p1", "p3", "p3#3"}
    data = json.loads(run_cli("verify", "--identities", "runs/ck1", "--json").stdout)
    assert data["target"] == "ck1"


@pytest.mark.slow
def test_embedding_lora_on_tied_weights_verifies(tmp_path, monkeypatch, hf_base, peft_on, run_cli):
    """GPT-2 ties lm_head to wte: the hand-patched reference must not move the head when wte's LoRA is patched
    (PEFT's embedding LoRA changes the input embedding only); logits then agree to float32 round-off."""
    gpt2 = hf_base("gpt2")
    for name, seed in (("g1", 1), ("g2", 2)):
        peft_on(gpt2, tmp_path / name, seed, target_modules=["c_attn", "attn.c_proj", "mlp.c_proj", "wte"],
                fan_in_fan_out=True)
    monkeypatch.chdir(tmp_path)
    assert run_cli("project", "--base", "g1", "--dir", "g2 - g1", "--trust", "0.02", "--out", "o").exit_code == 0
    res = run_cli("verify", "o", "--base-model", gpt2, "--json")
    checks = {c["name"]: c for c in json.loads(res.stdout)["checks"]}
    assert res.exit_code == 0, [c for c in checks.values() if not c["passed"]]
    assert checks["logits"]["figures"]["rel_max_diff"] < 1e-5


def _dense_figures(out: Path, dense_expr, dense_updates, skip=()):
    """verify's update and step figures from dense float64 of the raw files (safetensors + PEFT's scale rule):
    I_m = base_m + alpha dir_m with alpha from the manifest, W_m as PEFT reads it."""
    man = json.loads((out / "vecmerge.json").read_text())
    alpha = man["resolved"]["alpha"]
    base, d = dense_expr({"v54": 1.0}), dense_expr({"v51": 1.0, "v28": -1.0})
    written = dense_updates(out)
    names = [m for m in base if m not in skip]
    err = {m: float((written[m] - base[m] - alpha * d[m]).norm()) for m in names}
    tgt = {m: float((base[m] + alpha * d[m]).norm()) for m in names}
    step_sq = math.fsum(alpha**2 * float((d[m] ** 2).sum()) for m in base)
    moved = math.fsum(float(((written[m] - base[m]) * alpha * d[m]).sum()) for m in names)
    rel = {m: err[m] / tgt[m] for m in names}
    return {"rel": rel, "rel_error": math.sqrt(math.fsum(e * e for e in err.values()) / math.fsum(
        t * t for t in tgt.values())), "survival": moved / step_sq,
        "residual": math.sqrt(math.fsum(e * e for e in err.values()) / step_sq), "step_norm": math.sqrt(step_sq)}


@pytest.mark.parametrize("extra, compared_to", [((), "recomputed update"),
                                                (("--rank", "4"), "recorded rank-cut error")])
def test_update_and_step_figures_are_the_documented_formulas(toy, run_cli, dense_expr, dense_updates, extra,
                                                            compared_to):
    """Every figure of the update and step checks against dense float64 (rtol 1e-6: fp32 factors read back):
    per-module max, worst module, the aggregate ``sqrt(sum ||W - I||^2 / sum ||I||^2)``, survival
    ``sum <W - base, step> / ||step||^2``, residual ``||W - I|| / ||step||``, ||step||; and what it compared to."""
    project(run_cli, "out", *extra)
    want = _dense_figures(Path("out"), dense_expr, dense_updates)
    res = by_name(verify_output("out"))
    upd, step = res["update"], res["step"]
    assert upd["passed"] and step["passed"]
    assert upd["figures"]["worst_module"] == max(want["rel"], key=want["rel"].get)
    assert upd["figures"]["max_rel_error"] == pytest.approx(max(want["rel"].values()), rel=1e-6)
    assert upd["figures"]["rel_error"] == pytest.approx(want["rel_error"], rel=1e-6)
    assert (upd["figures"]["tolerance"], upd["figures"]["compared_to"]) == (1e-5, compared_to)
    assert upd["detail"] == ("every module within 1e-05 of the " + ("recorded rank-cut error" if extra else
                                                                     "recomputed update (relative Frobenius)"))
    for key in ("survival", "residual", "step_norm"):
        assert step["figures"][key] == pytest.approx(want[key], rel=1e-6), key
    assert step["figures"]["tolerance"] == 1e-4
    if extra:  # the cut loses part of the step: verify expects the recorded survival, not 1
        man = json.loads(Path("out/vecmerge.json").read_text())
        assert step["detail"].endswith(f"expected {man['figures']['survival']:.8f} within 0.0001")
        assert step["figures"]["survival"] < 1 - 1e-3


def test_a_rescaled_module_is_named_with_its_error_and_scale(toy, run_cli):
    """One module's B times 1.0001: the detail names it, its error, the file, and that its tensors are the
    recomputed ones scaled by 1.0001 (a pure rescaling is recognised as one)."""
    project(run_cli)
    rewrite_tensor(Path("out"), B_KEY, lambda t: t * (1 + 1e-4))
    upd = by_name(verify_output("out"))["update"]
    rel = upd["figures"]["max_rel_error"]
    assert upd["detail"] == (f"1/14 modules differ from the recomputed update, e.g. {MODULE}: relative error "
                             f"{rel:.3e} > 1e-05; tensors of {MODULE} in adapter_model.safetensors do not hold the "
                             "recomputed factors (scaled by 1.0001)")
    assert not upd["passed"] and upd["figures"]["bad_modules"] == [MODULE]


def test_a_changed_module_of_a_rank_cut_names_its_recorded_error(toy, run_cli):
    """A rank-cut output must be I cut on its own column space (first order: issue 36) and reproduce its recorded
    cut error: one module's B times 1.01 breaks the first, and the detail names the module and the figure."""
    project(run_cli, "out", "--rank", "4")
    rewrite_tensor(Path("out"), B_KEY, lambda t: t * 1.01)
    upd = by_name(verify_output("out"))["update"]
    man = json.loads(Path("out/vecmerge.json").read_text())
    assert not upd["passed"] and upd["figures"]["bad_modules"] == [MODULE]
    assert upd["detail"].startswith(f"1/14 modules differ from the recomputed update, e.g. {MODULE}: ||W - P_W I|| ")
    assert upd["figures"]["max_projected"] == pytest.approx(1e-2, rel=0.5)  # the edit's size, first order
    assert man["modules"][MODULE]["rel_error"] > 0


def test_a_changed_entry_is_not_called_a_rescaling(toy, run_cli):
    project(run_cli)
    rewrite_tensor(Path("out"), B_KEY, lambda t: t.index_put_((torch.tensor([0]), torch.tensor([0])),
                                                               t[0, 0] + 0.1 * t.abs().max()))
    detail = by_name(verify_output("out"))["update"]["detail"]
    assert detail.endswith("in adapter_model.safetensors do not hold the recomputed factors") and "scaled" not in detail


@pytest.mark.parametrize("which", [0, -1])
def test_an_unreadable_module_is_named_and_the_others_still_compared(toy, run_cli, dense_expr, dense_updates, which):
    """A module with a NaN (the first or the last compared) fails the update check by name; every other module is
    still compared (figures over the 13 others against dense float64, rtol 1e-6)."""
    project(run_cli)
    module = Adapter(Path("out")).modules[which]
    want = _dense_figures(Path("out"), dense_expr, dense_updates, skip=(module,))
    rewrite_tensor(Path("out"), f"base_model.model.{module}.lora_B.weight",
                   lambda t: t.index_put_((torch.tensor([0]), torch.tensor([0])), torch.tensor(float("nan"))))
    upd = by_name(verify_output("out"))["update"]
    assert not upd["passed"] and upd["detail"] == f"{module}: unreadable or non-finite factors"
    assert upd["figures"]["rel_error"] == pytest.approx(want["rel_error"], rel=1e-6)
    assert upd["figures"]["worst_module"] == max(want["rel"], key=want["rel"].get)


def test_a_module_whose_update_is_zero_verifies(tmp_path, monkeypatch, run_cli):
    """A zero backbone and a dropped (disagreeing) module: that module's intended update is exactly zero, its error
    is absolute (no division by a zero norm) and the output verifies."""
    from vecmerge.testing import toy_trajectory

    disagree = "model.layers.1.mlp.up_proj"
    toy_trajectory(tmp_path / "t", disagree=(disagree,))
    monkeypatch.chdir(tmp_path / "t")
    res = run_cli("project", "--base", "v54-v54", "--dir", "v51-v28", "--alpha", "0.1", "--consensus-ref",
                  "v54-v54e2", "--on-disagree", "drop", "--out", "z")
    assert res.exit_code == 0, res.output
    out = verify_output("z")
    assert out["passed"], [c for c in out["checks"] if not c["passed"]]
    assert Adapter(Path("z")).factors(disagree).norm() == 0.0


@pytest.mark.parametrize("edit", ["drop-entry", "string-error"])
def test_an_edited_record_of_a_rank_cut_fails_by_name(toy, run_cli, edit):
    """A rank-cut output is judged against its recorded per-module errors: a module whose record is gone or is not
    a number fails the update check by name (never a crash)."""
    project(run_cli, "out", "--rank", "4")
    path = Path("out/vecmerge.json")
    man = json.loads(path.read_text())
    if edit == "drop-entry":
        del man["modules"][MODULE]
    else:
        man["modules"][MODULE]["rel_error"] = "0.1"
    path.write_text(json.dumps(man))
    upd = by_name(verify_output("out"))["update"]
    assert not upd["passed"] and upd["figures"]["bad_modules"] == [MODULE]


def test_verify_reports_progress_over_every_module(toy, run_cli):
    project(run_cli)
    seen = []

    def progress(items, total=None):
        items = list(items)
        seen.append(items)
        return items

    assert verify_output("out", progress=progress)["passed"]
    # modules are compared on worker threads, so the bar advances once per finished module (not by name)
    assert len(Adapter(Path("out")).modules) in [len(s) for s in seen]


def test_compare_returns_the_recomputed_updates_unless_asked_not_to(toy, run_cli, dense_expr):
    """verify.checks.update.compare_to_recomputed keeps every module's recomputed update by default (the PEFT checks
    compare against them): each is ``base_m + alpha dir_m`` of dense float64 from the raw files (alpha from
    the manifest; rtol 1e-12)."""
    from vecmerge.recipe.load import with_absolute_inputs
    from vecmerge.verify.checks.output import TOLERANCES, recompute
    from vecmerge.verify.checks.update import compare_to_recomputed

    project(run_cli)
    man = json.loads(Path("out/vecmerge.json").read_text())
    ev, _ = recompute(with_absolute_inputs(man, Path("out")), Path("out"))
    out = Adapter(Path("out"))
    seen = []

    def progress(items, total=None):
        items = list(items)
        seen.append(len(items))
        return items

    checks, expected = compare_to_recomputed(out, ev, man, TOLERANCES["fp32"], progress)
    assert seen == [len(out.modules)]  # the bar advances once per compared module
    assert sorted(expected) == sorted(out.modules) and [c["name"] for c in checks] == ["update", "step"]
    alpha = man["resolved"]["alpha"]
    want = dense_expr({"v54": 1.0, "v51": alpha, "v28": -alpha})
    for m, got in expected.items():
        torch.testing.assert_close(got.dense(), want[m], rtol=1e-12, atol=1e-12 * float(want[m].abs().max()))
    assert compare_to_recomputed(out, ev, man, TOLERANCES["fp32"], keep_expected=False)[1] is None


def _full_space_ties(out: str) -> Path:
    """A TIES merge of v51 and v28 in full space: each module's intended update is a dense matrix (``Dense``)."""
    from vecmerge.pipeline import run
    from vecmerge.recipe.recipe import Recipe
    from vecmerge.workspace.names import Workspace

    run(Recipe.from_dict({"out": out, "method": "ties", "space": "full", "rank": "exact",
                          "models": [{"model": "v51", "weight": 1.0, "density": 0.5},
                                     {"model": "v28", "weight": -1.0, "density": 0.5}]}), Workspace())
    return Path(out)


def test_a_dense_space_merge_is_compared_densely(toy):
    """A full-space merge's target is a dense matrix: a clean output is within fp32 round-off of it, and one module's
    B times 1 + 1e-4 is found by name, with that relative error (rel 1e-3) and recognised as a rescaling."""
    _full_space_ties("ties")
    clean = by_name(verify_output("ties"))
    assert clean["update"]["passed"] and clean["update"]["figures"]["max_rel_error"] < 2e-7
    rewrite_tensor(Path("ties"), B_KEY, lambda t: t * (1 + 1e-4))
    upd = by_name(verify_output("ties"))["update"]
    assert not upd["passed"] and upd["figures"]["bad_modules"] == [MODULE]
    assert upd["figures"]["max_rel_error"] == pytest.approx(1e-4, rel=1e-3)
    assert upd["detail"].endswith("do not hold the recomputed factors (scaled by 1.0001)")


def _set_module(folder: Path, module: str, B: torch.Tensor, A: torch.Tensor) -> None:
    """Write ``module``'s factors (B, A) into ``folder`` (same rank and dtype as stored)."""
    path = folder / "adapter_model.safetensors"
    tensors = load_file(path)
    for key, t in ((f"base_model.model.{module}.lora_B.weight", B), (f"base_model.model.{module}.lora_A.weight", A)):
        tensors[key] = t.to(tensors[key].dtype).contiguous()
    save_file(tensors, path, metadata={"format": "pt"})


def test_a_zeroed_or_filled_in_module_fails_by_name_without_a_scale(tmp_path, monkeypatch):
    """Two changes no rescaling explains: a module whose written update is zeroed (W = 0), and a module whose intended
    update is zero (a zero backbone, a dropped module) written non-zero. Each fails the update check by name, as tensors
    that do not hold the recomputed factors, with no scale named and no crash."""
    from vecmerge.pipeline import run
    from vecmerge.recipe.recipe import Recipe
    from vecmerge.testing import toy_trajectory
    from vecmerge.workspace.names import Workspace

    disagree = "model.layers.1.mlp.up_proj"
    toy_trajectory(tmp_path / "t", disagree=(disagree,))
    monkeypatch.chdir(tmp_path / "t")
    run(Recipe.from_dict({"base": "v54-v54", "dir": "v51-v28", "alpha": 0.1, "out": "z",
                          "consensus": {"ref": "v54-v54e2", "on_disagree": "drop"}}), Workspace())
    specs = Adapter(Path("z")).specs
    (o, i), r = specs[disagree].shape, specs[disagree].rank
    _set_module(Path("z"), disagree, torch.ones(o, r), torch.ones(r, i))    # intended 0, written non-zero
    (o, i), r = specs[MODULE].shape, specs[MODULE].rank
    _set_module(Path("z"), MODULE, torch.zeros(o, r), torch.zeros(r, i))    # intended non-zero, written 0
    upd = by_name(verify_output("z"))["update"]
    assert not upd["passed"] and sorted(upd["figures"]["bad_modules"]) == sorted([disagree, MODULE])
    assert upd["detail"].endswith("in adapter_model.safetensors do not hold the recomputed factors")
    assert "scaled" not in upd["detail"]


@pytest.mark.parametrize("share", [0.3, 3.0])
def test_the_rescale_hint_is_as_sharp_as_the_update_tolerance(toy, run_cli, dense_expr, dense_updates, share):
    """One module written as 1.001 * I_m plus a rank-one change E: verify names the scale exactly when the rest,
    ``||W_m / c - I_m|| / ||I_m||`` with ``c = <W_m, I_m> / ||I_m||^2`` (computed here in float64 from the file), is
    within the update tolerance 1e-5. E is sized to 0.3 and 3 times the tolerance."""
    project(run_cli)
    tol = TOLERANCES["fp32"]["update"]
    alpha = json.loads(Path("out/vecmerge.json").read_text())["resolved"]["alpha"]
    want = dense_expr({"v54": 1.0, "v51": alpha, "v28": -alpha})[MODULE]
    B = load_file("out/adapter_model.safetensors")[B_KEY].double()
    A = load_file("out/adapter_model.safetensors")[B_KEY.replace("lora_B", "lora_A")].double()
    s = float(dense_updates(Path("out"))[MODULE].norm() / (B @ A).norm())
    E = torch.zeros_like(B)
    E[:, 0] = torch.linspace(-1.0, 1.0, B.shape[0], dtype=torch.float64)

    def rest(W):
        c = float((W * want).sum() / (want * want).sum())
        return float((W / c - want).norm() / want.norm())

    unit = rest(1.001 * s * B @ A + s * (E * 1e-3) @ A) / 1e-3   # the rest per unit of E (it is linear in E)
    rewrite_tensor(Path("out"), B_KEY, lambda t: (1.001 * B + E * (share * tol / unit)).to(t.dtype))
    got = rest(dense_updates(Path("out"))[MODULE])
    assert got == pytest.approx(share * tol, rel=0.05)
    upd = by_name(verify_output("out"))["update"]
    assert not upd["passed"] and upd["figures"]["bad_modules"] == [MODULE]
    assert upd["detail"].endswith("(scaled by 1.001)") is (share < 1), upd["detail"]


def test_an_output_with_no_readable_module_fails_without_a_crash(toy, run_cli):
    """A NaN in every module: nothing can be compared, so the update check fails naming the modules, its figures say
    there is no worst module (None) and no error was summed (0.0); the finite check names them too."""
    project(run_cli)
    modules = Adapter(Path("out")).modules
    path = Path("out/adapter_model.safetensors")
    tensors = load_file(path)
    for m in modules:
        tensors[f"base_model.model.{m}.lora_B.weight"][0, 0] = float("nan")
    save_file(tensors, path, metadata={"format": "pt"})
    res = by_name(verify_output("out"))
    upd = res["update"]
    listed = "; ".join(f"{m}: unreadable or non-finite factors" for m in modules[:3])
    assert not upd["passed"] and upd["detail"] == f"{listed} and {len(modules) - 3} more"
    assert (upd["figures"]["max_rel_error"], upd["figures"]["worst_module"], upd["figures"]["rel_error"]) == (
        None, None, 0.0)
    assert not res["finite"]["passed"]


def test_changed_and_missing_inputs_are_each_named_with_their_hashes(toy, run_cli):
    """Every input is checked (not only up to the first problem): a changed weights file and a changed config are
    named with the first 16 hex digits of the sha256 found (hashlib here) and of the one pinned; two missing inputs
    are both named."""
    import hashlib

    project(run_cli)
    man = json.loads(Path("out/vecmerge.json").read_text())
    key = sorted(load_file(toy / "v28" / "adapter_model.safetensors"))[0]
    rewrite_tensor(toy / "v28", key, lambda t: t * 1.01)
    cfg_path = toy / "v51" / "adapter_config.json"
    cfg_path.write_text(cfg_path.read_text().replace("{", '{"vecmerge_test": 1, ', 1))
    sha = lambda p: hashlib.sha256(p.read_bytes()).hexdigest()  # noqa: E731
    detail = by_name(verify_output("out"))["inputs"]["detail"]
    weights = toy / "v28" / "adapter_model.safetensors"
    assert (f"input v28: {weights} has sha256 {sha(weights)[:16]}..., the manifest pins "
            f"{man['recipe']['inputs']['v28']['sha256'][:16]}...: it changed after the merge") in detail
    assert (f"input v51: {cfg_path} changed after the merge (sha256 {sha(cfg_path)[:16]}..., pinned "
            f"{man['inputs']['v51']['config_sha256'][:16]}...)") in detail
    shutil.rmtree(toy / "v28")
    shutil.rmtree(toy / "v51")
    detail = by_name(verify_output("out"))["inputs"]["detail"]
    assert "input v28 is missing or unreadable" in detail and "input v51 is missing or unreadable" in detail


def test_with_no_module_compared_the_step_check_fails(toy, run_cli):
    """A NaN in every module of a projection: no module can be compared, so the step's survival is not measured,
    and the step check fails saying so (it used to pass on a survival of 1.0 by default)."""
    project(run_cli)
    path = Path("out/adapter_model.safetensors")
    tensors = load_file(path)
    modules = Adapter(Path("out")).modules
    for m in modules:
        tensors[f"base_model.model.{m}.lora_A.weight"][0, 0] = float("nan")
    save_file(tensors, path, metadata={"format": "pt"})
    step = by_name(verify_output("out"))["step"]
    assert not step["passed"]
    assert step["detail"] == (f"no module was compared ({len(modules)} could not be): the step's survival is not "
                              "measured")
    assert step["figures"] == {"survival": None, "residual": None, "tolerance": TOLERANCES["fp32"]["survival"],
                               "step_norm": None}


def _sha(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_inputs_check_names_every_input_and_reports_their_hashes(toy, run_cli):
    """A clean output: the inputs check lists the inputs the recipe pins, in its order, and its figures are each
    input's weights sha256 (hashlib here). Two problems are reported one after the other, separated by '; '."""
    project(run_cli)
    man = json.loads(Path("out/vecmerge.json").read_text())
    names = list(man["recipe"]["inputs"])
    assert sorted(names) == ["v28", "v51", "v54"]
    inputs = by_name(verify_output("out"))["inputs"]
    assert inputs["passed"] and inputs["detail"] == f"3 inputs hash as pinned: {', '.join(names)}"
    assert inputs["figures"] == {n: _sha(toy / n / "adapter_model.safetensors") for n in names}
    for n in ("v28", "v51"):
        rewrite_tensor(toy / n, sorted(load_file(toy / n / "adapter_model.safetensors"))[0], lambda t: t * 1.01)
    inputs = by_name(verify_output("out"))["inputs"]
    want = [f"input {n}: {toy / n / 'adapter_model.safetensors'} has sha256 "
            f"{_sha(toy / n / 'adapter_model.safetensors')[:16]}..., the manifest pins "
            f"{man['recipe']['inputs'][n]['sha256'][:16]}...: it changed after the merge"
            for n in names if n != "v54"]
    assert not inputs["passed"] and inputs["detail"] == "; ".join(want)


def test_inputs_saving_full_modules_are_reopened_with_the_recipes_policy(toy, run_cli):
    """Inputs whose config lists modules_to_save merge only with ``--modules-to-save drop``; verify reopens them
    with the policy the manifest's recipe records, so the output verifies (reopened with the default, refuse,
    every input would be 'missing or unreadable')."""
    for n in ("v28", "v51", "v54"):
        cfg = toy / n / "adapter_config.json"
        cfg.write_text(json.dumps({**json.loads(cfg.read_text()), "modules_to_save": ["lm_head"]}))
    assert run_cli("project", "--base", "v54", "--dir", "v51-v28", "--trust", "0.0113", "--out", "out"
                   ).exit_code == 2
    project(run_cli, "out", "--modules-to-save", "drop")
    assert json.loads(Path("out/vecmerge.json").read_text())["recipe"]["modules_to_save"] == "drop"
    res = by_name(verify_output("out"))
    assert res["inputs"]["passed"], res["inputs"]["detail"]
    assert all(c["passed"] for c in res.values()), [c["detail"] for c in res.values() if not c["passed"]]


NOT_MAPS = "the manifest's recipe.inputs and inputs must map names to {path, sha256}"


@pytest.mark.parametrize("edit, message", [
    (lambda man, first: man.update(inputs=[first]), NOT_MAPS),
    (lambda man, first: man["recipe"].update(inputs=first), NOT_MAPS),
    (lambda man, first: man["recipe"]["inputs"].update({first: first}), "input {first}: the manifest records no path"),
    (lambda man, first: man["recipe"]["inputs"].update({first: {"path": 28, "sha256": "0" * 64}}),
     "input {first}: the manifest records no path"),
])
def test_a_malformed_inputs_map_fails_the_inputs_check_by_name(toy, run_cli, edit, message):
    """A hand-edited manifest whose inputs are not maps of {path, sha256} fails the inputs check with a message
    naming what is wrong (not a crash); an input without a path is named and the inputs after it still checked."""
    from vecmerge.verify.checks.output import input_check

    project(run_cli)
    man = json.loads(Path("out/vecmerge.json").read_text())
    names = list(man["recipe"]["inputs"])
    edit(man, names[0])
    res = input_check(man)
    assert res["name"] == "inputs" and not res["passed"] and res["detail"] == message.replace("{first}", names[0])
    if "records no path" in message:
        assert sorted(res["figures"]) == sorted(names[1:])


def test_an_input_without_a_recorded_config_hash_is_checked_by_its_weights(toy, run_cli):
    """The manifest's ``inputs`` section pins each input's config; an input it has no entry for (or a malformed
    one) has its weights checked all the same, and no config hash is asked of it."""
    from vecmerge.verify.checks.output import input_check

    project(run_cli)
    man = json.loads(Path("out/vecmerge.json").read_text())
    del man["inputs"]["v28"]
    man["inputs"]["v51"] = "not a map"
    res = input_check(man)
    assert res["passed"] and sorted(res["figures"]) == ["v28", "v51", "v54"], res["detail"]
    rewrite_tensor(toy / "v28", sorted(load_file(toy / "v28" / "adapter_model.safetensors"))[0], lambda t: t * 2)
    res = input_check(man)
    assert not res["passed"] and res["detail"].startswith("input v28: "), res["detail"]


def test_a_dense_space_merge_is_verified_one_dense_update_at_a_time(toy, monkeypatch):
    """Without ``--base-model`` nothing needs the recomputed updates after the comparison: on one worker thread, each
    module's dense update is released before the next module's is formed (a full-space merge of a large model
    would otherwise hold every module's dense matrix at once)."""
    import gc
    import weakref

    import vecmerge.verify.checks.update as verify

    _full_space_ties("ties")
    monkeypatch.setenv("VECMERGE_THREADS", "1")
    formed, alive_at_each = [], []
    real = verify.intended_core

    def watched(ev, m, multiple):
        gc.collect()
        alive_at_each.append(sum(r() is not None for r in formed))
        core, step = real(ev, m, multiple)
        formed.append(weakref.ref(core))
        return core, step

    monkeypatch.setattr(verify, "intended_core", watched)
    assert by_name(verify_output("ties"))["update"]["passed"]
    assert len(formed) == len(Adapter(Path("ties")).modules) and alive_at_each == [0] * len(formed)


def test_a_zero_step_verifies_with_the_pipelines_convention(toy, run_cli):
    """``--alpha 0``: the output is the base, and the step, zero, has no direction to survive along; the step check
    reports the convention the pipeline records (survival 1, residual 0, no division by a zero norm) and passes,
    while the update check measures the output against the base."""
    res = run_cli("project", "--base", "v54", "--dir", "v51-v28", "--alpha", "0", "--out", "out")
    assert res.exit_code == 0, res.output
    man = json.loads(Path("out/vecmerge.json").read_text())
    checks = by_name(verify_output("out"))
    assert all(c["passed"] for c in checks.values()), [c["detail"] for c in checks.values() if not c["passed"]]
    step = checks["step"]["figures"]
    assert (step["survival"], step["residual"], step["step_norm"]) == (1.0, 0.0, 0.0)
    assert step["survival"] == man["figures"]["survival"]


@pytest.mark.parametrize("value", [0.5, None])
def test_the_step_of_a_lossless_output_is_judged_against_one_not_its_record(toy, run_cli, value):
    """A lossless output's survival must be 1 within the tolerance whatever its manifest records: an edited (or
    removed) figures.survival leaves the step check passing against 1 and fails the figures check, by name."""
    project(run_cli)
    path = Path("out/vecmerge.json")
    man = json.loads(path.read_text())
    if value is None:
        del man["figures"]["survival"]
    else:
        man["figures"]["survival"] = value
    path.write_text(json.dumps(man))
    checks = by_name(verify_output("out"))
    assert checks["step"]["passed"] and checks["step"]["detail"].endswith("expected 1.00000000 within 0.0001")
    assert not checks["figures"]["passed"] and "figures.survival" in checks["figures"]["detail"]


@pytest.mark.parametrize("value", ["missing", "0.99", True, None])
def test_a_rank_cut_without_a_numeric_recorded_survival_fails_the_step_check(toy, run_cli, value):
    """A rank-cut output's survival is judged against the one its manifest records: a record that is gone or is not
    a number (a string, a bool, null) fails the step check (never a crash, never a comparison with 1). Rank 12 keeps
    the toy's whole update (survival 1 within round-off), so a comparison with 1 would pass."""
    project(run_cli, "out", "--rank", "12")
    path = Path("out/vecmerge.json")
    man = json.loads(path.read_text())
    recorded = man["figures"]["survival"]
    assert verify_output("out")["passed"] and abs(recorded - 1) < 1e-4  # within the fp32 tolerance of 1 as well
    if value == "missing":
        del man["figures"]["survival"]
    else:
        man["figures"]["survival"] = value
    path.write_text(json.dumps(man))
    step = by_name(verify_output("out"))["step"]
    assert not step["passed"] and step["detail"].endswith("expected nan within 0.0001"), step["detail"]


def test_a_copied_output_verifies_against_the_workspace_given(tmp_path, monkeypatch, run_cli):
    """Issue 23: an output copied out of its workspace looked its inputs up beside the copy and ignored
    ``--workspace``; now the manifest's relative input paths start at the given workspace's folder (and the
    inputs check says so); without it, the failure says to pass ``--workspace``."""
    import shutil

    from vecmerge.testing import toy_trajectory

    toy_trajectory(tmp_path / "t")
    monkeypatch.chdir(tmp_path / "t")
    assert run_cli("project", "--base", "v54", "--dir", "v51-v28", "--alpha", "0.1", "--out", "mv/o").exit_code == 0
    shutil.copytree(tmp_path / "t" / "mv", tmp_path / "copy" / "mv")
    monkeypatch.chdir(tmp_path)
    r = run_cli("verify", "copy/mv/o")
    assert r.exit_code == 1 and "pass --workspace PATH/vecmerge.yaml" in r.output
    r = run_cli("verify", "--workspace", "t/vecmerge.yaml", "copy/mv/o", "--json")
    assert r.exit_code == 0, r.output
    inputs = json.loads(r.output)["checks"][0]
    assert inputs["name"] == "inputs" and f"resolved against --workspace {(tmp_path / 't').resolve()}" in inputs[
        "detail"]
