"""The pipeline end to end: consensus gate, rank cuts and survival, keep-base, dose ladders, outputs.

References are dense float64 updates read without vecmerge (``dense_expr``, ``dense_updates``:
safetensors + PEFT's scale rule). Survival and residual of a rank cut agree with a dense SVD cut to
rtol 1e-4 (the dense reference cuts the float64 update, ours the same update's core, then rounds to fp32).
"""

import json
import math
import shutil

import pytest
import torch
from conftest import SPLIT_DISAGREE as DISAGREE  # noqa: E402
from conftest import fro  # noqa: E402
from safetensors.torch import load_file

from vecmerge.errors import CheckFailed
from vecmerge.pipeline import run as _run
from vecmerge.recipe.recipe import Recipe
from vecmerge.testing import toy_trajectory, tree_hashes
from vecmerge.workspace.names import Workspace


def run(*args, **kwargs) -> dict:
    return _run(*args, **kwargs).to_dict()




def test_consensus_fail_drop_keep(split, run_cli, dense_expr, dense_updates):
    args = ["project", "--base", "v54", "--dir", "v51-v28", "--trust", "0.01", "--consensus-ref", "v54-v54e2"]
    before = tree_hashes(split)
    res = run_cli(*args, "--out", "o_fail")
    assert res.exit_code == 1 and DISAGREE in res.output and "nothing written" in res.output
    assert not (split / "o_fail").exists()
    res = run_cli(*args, "--on-disagree", "keep", "--min-agree", "0.99", "--out", "o_min")
    assert res.exit_code == 1 and "13/14 modules agree" in res.output and not (split / "o_min").exists()

    res = run_cli(*args, "--on-disagree", "drop", "--out", "o_drop", "--json")
    assert res.exit_code == 0, res.output
    rep = json.loads(res.output)
    assert rep["consensus"]["agree"] == 13 and rep["step"]["dropped"] == [DISAGREE]
    base, d = dense_expr({"v54": 1.0}), dense_expr({"v51": 1.0, "v28": -1.0})
    d[DISAGREE] = torch.zeros_like(d[DISAGREE])
    alpha = 0.01 * fro(base) / fro(d)  # alpha is chosen after the mask
    assert rep["step"]["alpha"] == pytest.approx(alpha, rel=1e-12)
    got = dense_updates(split / "o_drop")
    torch.testing.assert_close(got[DISAGREE], base[DISAGREE], rtol=0, atol=1e-7)

    res = run_cli(*args, "--on-disagree", "keep", "--out", "o_keep", "--json")
    assert res.exit_code == 0 and json.loads(res.output)["step"]["dropped"] == []
    after = tree_hashes(split)
    assert {k: v for k, v in after.items() if k.startswith("v")} == before  # inputs untouched


def test_survival_of_a_rank_cut_against_dense(toy, dense_expr):
    ws = Workspace()
    rep = run(Recipe.from_dict({"base": "v54", "dir": "v51-v28", "trust": 0.0113, "rank": "4"}), ws, dry_run=True)
    alpha = rep["step"]["alpha"]
    base, d = dense_expr({"v54": 1.0}), dense_expr({"v51": 1.0, "v28": -1.0})
    num = den = res2 = 0.0
    for m in base:
        target = base[m] + alpha * d[m]
        U, S, Vh = torch.linalg.svd(target)
        cut = (U[:, :4] * S[:4]) @ Vh[:4]
        step = alpha * d[m]
        num += float(((cut - base[m]) * step).sum())
        den += float((step**2).sum())
        res2 += float(((cut - target) ** 2).sum())
    fig = rep["outputs"][0]["figures"]
    assert fig["survival"] == pytest.approx(num / den, rel=1e-4, abs=1e-6)
    assert fig["residual"] == pytest.approx(math.sqrt(res2 / den), rel=1e-4)
    assert fig["survival"] < 0.99 and rep["outputs"][0]["warnings"]
    with pytest.raises(CheckFailed, match="--strict"):
        run(Recipe.from_dict({"base": "v54", "dir": "v51-v28", "trust": 0.0113, "rank": "4", "strict": True}), ws,
            dry_run=True)


def test_keep_base_keeps_backbone_factors_bit_for_bit(toy, run_cli):
    res = run_cli("project", "--base", "v54", "--dir", "v51-v28", "--trust", "0.0113", "--rank", "keep-base",
                  "--out", "kb")
    assert res.exit_code == 0, res.output
    src = load_file(toy / "v54" / "adapter_model.safetensors")
    out = load_file(toy / "kb" / "adapter_model.safetensors")
    for k, v in src.items():
        r = v.shape[0] if k.endswith("lora_A.weight") else v.shape[1]
        part = out[k][:r] if k.endswith("lora_A.weight") else out[k][:, :r]
        assert torch.equal(part, v)
    man = json.loads((toy / "kb" / "vecmerge.json").read_text())
    assert man["figures"]["survival"] == pytest.approx(1.0, abs=1e-4)


@pytest.mark.parametrize("alpha_factor, rslora", [(2, False), (0.5, False), (2, True)])
def test_keep_base_keeps_the_backbones_scale(tmp_path, monkeypatch, run_cli, alpha_factor, rslora):
    """A backbone with lora_alpha = 2r (or r/2, or rsLoRA): its factors are kept and PEFT's scale stays its
    own (alpha/r, alpha/sqrt(r)); verify recomputes base + alpha * dir within the fp32 tolerance."""
    from vecmerge.peft.adapter import Adapter
    from vecmerge.testing import toy_adapter
    from vecmerge.verify.checks.output import verify_output

    monkeypatch.chdir(tmp_path)
    toy_adapter("b", rank=4, lora_alpha=4 * alpha_factor, rslora=rslora, seed=1)
    toy_adapter("x", rank=4, seed=2)
    toy_adapter("y", rank=4, seed=3)
    res = run_cli("project", "--base", "b", "--dir", "x - y", "--alpha", "0.1", "--rank", "keep-base", "--out", "kb")
    assert res.exit_code == 0, res.output
    src, out = Adapter("b"), Adapter("kb")
    for m, spec in src.specs.items():
        assert out.specs[m].scale == spec.scale  # the backbone's own scale, to the bit
    assert verify_output("kb")["passed"]



def test_keep_base_of_a_silent_backbone_writes_the_step(tmp_path, monkeypatch, run_cli, dense_expr):
    """A backbone of lora_alpha 0 contributes nothing: keep-base writes base + alpha * dir = the step alone (its
    factors under a non-zero scale would add B0 A0; that output failed verify). Against dense float64 references
    (safetensors + PEFT's scale rule) within the fp32 tolerance, 1e-5 of each module's norm; verify passes."""
    from vecmerge.peft.adapter import Adapter
    from vecmerge.testing import toy_adapter
    from vecmerge.verify.checks.output import verify_output

    monkeypatch.chdir(tmp_path)
    toy_adapter("b", rank=4, lora_alpha=0.0, seed=1)
    toy_adapter("x", rank=4, seed=2)
    toy_adapter("y", rank=4, seed=3)
    res = run_cli("project", "--base", "b", "--dir", "x - y", "--alpha", "0.1", "--rank", "keep-base", "--out", "kb")
    assert res.exit_code == 0, res.output
    want, out = dense_expr({"x": 0.1, "y": -0.1}), Adapter("kb")
    for m, w in want.items():
        torch.testing.assert_close(out.factors(m).dense(), w, rtol=0, atol=1e-5 * float(torch.linalg.norm(w)))
    assert verify_output("kb")["passed"]

def test_dose_ladder_manifest_rerun_and_refusals(toy, run_cli):
    res = run_cli("project", "--base", "v54", "--dir", "v51-v28", "--trust", "0.0113", "--dose", "0.5,1,1.456",
                  "--out", "out/v58", "--json")
    assert res.exit_code == 0, res.output
    rep = json.loads(res.output)
    alphas = [o["alpha"] for o in rep["outputs"]]
    assert alphas == [0.5 * rep["step"]["alpha"], rep["step"]["alpha"], 1.456 * rep["step"]["alpha"]]
    assert [o["realized"]["global"] for o in rep["outputs"]] == pytest.approx([0.00565, 0.0113, 0.0113 * 1.456])
    for k in ("0.5", "1", "1.456"):
        assert (toy / f"out/v58-x{k}" / "adapter_model.safetensors").is_file()
    sha = rep["outputs"][2]["sha256"]
    res = run_cli("run", "out/v58-x1.456/vecmerge.json", "--out", "again")
    assert res.exit_code == 0, res.output
    assert json.loads((toy / "again" / "vecmerge.json").read_text())["output"]["sha256"] == sha
    res = run_cli("run", "out/v58-x1.456/vecmerge.json", "--out", "again")
    assert res.exit_code == 2 and "already exists; pass --force" in res.output


def test_dry_run_writes_nothing(toy, run_cli):
    res = run_cli("project", "--base", "v54", "--dir", "v51-v28", "--trust", "0.0113", "--out", "dry", "--dry-run")
    assert res.exit_code == 0 and "dry run: nothing written" in res.output
    assert not (toy / "dry").exists()


@pytest.mark.slow
def test_peft_loads_project_output_and_agrees(tiny_base, peft_adapter, peft_deltas, run_cli, tmp_path, monkeypatch):
    import warnings

    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    names = {"b54": peft_adapter("p54", seed=54, dtype=torch.bfloat16),
             "b51": peft_adapter("p51", seed=51, use_rslora=True, r=8, lora_alpha=8),
             "b28": peft_adapter("p28", seed=28, use_rslora=True, r=8, lora_alpha=8)}
    monkeypatch.chdir(tmp_path)
    (tmp_path / "vecmerge.yaml").write_text("adapters:\n" + "".join(f"  {k}: {v}\n" for k, v in names.items()))
    res = run_cli("project", "--base", "b54", "--dir", "b51 - b28", "--alpha", "0.05", "--out", "pm")
    assert res.exit_code == 0, res.output
    ws = Workspace()
    want = ws.evaluate("b54 + 0.05*(b51 - b28)")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_base), tmp_path / "pm")
    deltas = peft_deltas(model)
    assert len(deltas) == 14
    for m, got in deltas.items():
        ref = want[m].dense()
        torch.testing.assert_close(got, ref, rtol=0, atol=1e-6 * float(ref.abs().max()))


def test_streaming_bases_give_identical_bytes(toy, run_cli, monkeypatch):
    """Large models form each module's bases twice instead of holding them all: same bytes out."""
    import vecmerge.pipeline.evaluation as evaluation

    args = ["project", "--base", "v54", "--dir", "v51-v28", "--trust", "0.0113", "--consensus-ref", "v54-v54e2"]
    assert run_cli(*args, "--out", "kept").exit_code == 0
    monkeypatch.setattr(evaluation, "BASES_BUDGET", 0)
    assert run_cli(*args, "--out", "streamed").exit_code == 0
    a = json.loads((toy / "kept" / "vecmerge.json").read_text())
    b = json.loads((toy / "streamed" / "vecmerge.json").read_text())
    assert a["output"]["sha256"] == b["output"]["sha256"] and a["figures"] == b["figures"]


def test_out_may_not_be_an_input_or_inside_one(toy, run_cli):
    shutil.copytree(toy / "v28", toy / "av")
    before = tree_hashes(toy)
    for out, how in (("av", "is the input av"), ("av/sub", "lies inside the input av"), (".", "contains the input")):
        res = run_cli("refactor", "av + v51", "--out", out, "--force")
        assert res.exit_code == 2 and how in res.output and "vecmerge never writes" in res.output, (out, res.output)
    assert tree_hashes(toy) == before


def test_duplicate_doses_are_refused_before_writing(toy, run_cli):
    res = run_cli("project", "--base", "v54", "--dir", "v51-v28", "--trust", "0.01", "--dose", "1,1.0", "--out", "d")
    assert res.exit_code == 2 and "same folder" in res.output and not (toy / "d-x1").exists()


MANY = tuple(f"model.layers.{i}.{t}" for i in (0, 1) for t in ("mlp.up_proj", "mlp.down_proj", "mlp.gate_proj",
                                                                "self_attn.o_proj"))


def test_modules_without_a_step_are_reported_with_their_reason(tmp_path, monkeypatch, run_cli, dense_expr):
    """Issue 12 items 5 and 7: onto-ref's zero steps are named with the reason (text, JSON, manifest), apart
    from the consensus's drops; long lists end in "and N more". The zeroed set is checked against a dense
    float64 sign of <dir_m, ref_m>."""
    root = tmp_path / "many"
    toy_trajectory(root, disagree=MANY)
    monkeypatch.chdir(root)
    ref, d = dense_expr({"v54": 1.0, "v54e2": -1.0}), dense_expr({"v51": 1.0, "v28": -1.0})
    against = sorted(m for m in d if float((ref[m] * d[m]).sum()) <= 0)
    assert against == sorted(MANY)
    args = ["project", "--base", "v54", "--dir", "v51-v28", "--trust", "0.01", "--consensus-ref", "v54-v54e2"]
    res = run_cli(*args, "--mode", "onto-ref", "--on-disagree", "keep", "--out", "o")
    assert res.exit_code == 0, res.output
    line = next(x for x in res.output.splitlines() if x.startswith("no step from mode onto-ref"))
    assert "8: " in line and "and 2 more" in line and "points against the reference" in line
    man = json.loads((root / "o" / "vecmerge.json").read_text())["resolved"]
    assert man["dropped_by_consensus"] == [] and sorted(man["zeroed_by_method"]) == against
    assert "points against the reference" in man["zeroed_reason"] and "dropped" not in man
    rep = json.loads(run_cli(*args, "--mode", "onto-ref", "--on-disagree", "keep", "--dry-run", "--json").stdout)
    assert sorted(rep["step"]["zeroed_by_method"]) == against and rep["step"]["dropped_by_consensus"] == []
    assert run_cli("verify", "o").exit_code == 0

    res = run_cli(*args, "--on-disagree", "drop", "--out", "o2")
    line = next(x for x in res.output.splitlines() if x.startswith("dropped by consensus"))
    assert "8: " in line and "and 2 more" in line and "on_disagree=drop" in line
    man = json.loads((root / "o2" / "vecmerge.json").read_text())["resolved"]
    assert sorted(man["dropped_by_consensus"]) == against and man["zeroed_by_method"] == []


def test_large_steps_and_zero_outputs_warn(toy, run_cli):
    """Issue 12 item 15: a 500% step and an all-zero adapter are written with a warning (and --strict refuses)."""
    res = run_cli("project", "--base", "v54", "--dir", "v51-v28", "--trust", "5", "--out", "big")
    assert res.exit_code == 0 and "warning: big: the step is 500% of the backbone's norm" in res.output
    res = run_cli("project", "--base", "v54", "--dir", "v51-v28", "--trust", "5", "--out", "big2", "--strict")
    assert res.exit_code == 1 and not (toy / "big2").exists()
    res = run_cli("refactor", "0*v54", "--out", "zero", "--json")
    assert res.exit_code == 0
    out = json.loads(res.stdout)["outputs"][0]
    assert out["figures"]["norm"] == 0.0 and any("zero in every module" in w for w in out["warnings"])
    assert all(float(t.abs().max()) == 0.0 for t in load_file(toy / "zero" / "adapter_model.safetensors").values())
    res = run_cli("project", "--base", "v54", "--dir", "v51-v28", "--trust", "0.0113", "--dry-run")
    assert "warning" not in res.output  # a trust region of 1.13% is quiet


def test_output_ready_to_upload_and_portable(tmp_path, monkeypatch, run_cli):
    """Issue 12 item 9: the hub id goes into adapter_config.json and the card; vecmerge.json holds no absolute
    path of the workspace, and the output verifies and re-runs bit for bit from another folder and after the
    whole workspace moved."""
    ws = tmp_path / "ws"
    toy_trajectory(ws)
    (ws / "vecmerge.yaml").write_text((ws / "vecmerge.yaml").read_text() + "base_model_id: Org/tiny-base\n")
    monkeypatch.chdir(ws)
    res = run_cli("project", "--base", "v54", "--dir", "v51-v28", "--trust", "0.0113", "--out", "out/v58")
    assert res.exit_code == 0, res.output
    out = ws / "out" / "v58"
    assert json.loads((out / "adapter_config.json").read_text())["base_model_name_or_path"] == "Org/tiny-base"
    assert "base_model: Org/tiny-base" in (out / "README.md").read_text()
    text = (out / "vecmerge.json").read_text()
    man = json.loads(text)
    assert str(tmp_path) not in text and man["workspace"] == "../.."
    assert man["recipe"]["base_model_id"] == "Org/tiny-base"
    assert {n: i["path"] for n, i in man["inputs"].items()} == {n: n for n in ("v54", "v51", "v28")}
    assert run_cli("project", "--base", "v54", "--dir", "v51-v28", "--trust", "0.0113", "--out", "o2",
                   "--base-model-id", "Org/other").exit_code == 0
    assert json.loads((ws / "o2" / "adapter_config.json").read_text())["base_model_name_or_path"] == "Org/other"
    res = run_cli("refactor", "v54", "--out", "o3", "--base-model-id", "./models/base")
    assert res.exit_code == 2 and "--base-model-id './models/base': a hub id" in res.output

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert run_cli("verify", out).exit_code == 0
    assert run_cli("run", out / "vecmerge.json", "--out", "again").exit_code == 0
    sha = json.loads((elsewhere / "again" / "vecmerge.json").read_text())["output"]["sha256"]
    assert sha == man["output"]["sha256"]

    moved = tmp_path / "moved"
    shutil.move(str(ws), str(moved))
    assert run_cli("verify", moved / "out" / "v58").exit_code == 0


def test_a_local_base_model_path_is_noted_not_uploaded(tmp_path, monkeypatch, run_cli):
    """Without a hub id the report says the config names a local path, and the card claims no base model."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models" / "base").mkdir(parents=True)
    toy_trajectory(tmp_path / "t")
    for name in ("v54", "v51", "v28"):
        cfg = tmp_path / "t" / name / "adapter_config.json"
        cfg.write_text(cfg.read_text().replace('"toy-base"', json.dumps(str(tmp_path / "models" / "base"))))
    res = run_cli("--workspace", "t/vecmerge.yaml", "project", "--base", "v54", "--dir", "v51-v28", "--trust",
                  "0.01", "--out", "o")
    assert res.exit_code == 0 and "note: adapter_config.json names the base model by the local path models/base" \
        in res.output and "--base-model-id" in res.output
    assert "base_model:" not in (tmp_path / "o" / "README.md").read_text()
    man = json.loads((tmp_path / "o" / "vecmerge.json").read_text())
    assert man["inputs"]["v54"]["base_model"] == str(tmp_path / "models" / "base")  # outside the workspace t/
    assert run_cli("--workspace", "t/vecmerge.yaml", "project", "--base", "v54", "--dir", "v51-v28", "--trust",
                   "0.01", "--out", "t/o").exit_code == 0
    man = json.loads((tmp_path / "t" / "o" / "vecmerge.json").read_text())
    assert man["workspace"] == ".." and man["inputs"]["v54"] == {**man["inputs"]["v54"], "path": "v54"}


def test_an_upload_ready_manifest_records_the_declared_base_by_its_hub_id(tmp_path, monkeypatch, run_cli):
    """Issue 23: the inputs declare the base model by an absolute local folder outside the workspace; with a hub
    id known the output is upload-ready, so its vecmerge.json names the hub id, never the local path."""
    base = tmp_path / "models" / "base"
    base.mkdir(parents=True)
    toy_trajectory(tmp_path / "t")
    for name in ("v54", "v51", "v28"):
        cfg = tmp_path / "t" / name / "adapter_config.json"
        cfg.write_text(cfg.read_text().replace('"toy-base"', json.dumps(str(base))))
    monkeypatch.chdir(tmp_path / "t")
    res = run_cli("project", "--base", "v54", "--dir", "v51-v28", "--trust", "0.01", "--out", "o",
                  "--base-model-id", "Org/tiny-base")
    assert res.exit_code == 0 and "note:" not in res.output, res.output
    text = (tmp_path / "t" / "o" / "vecmerge.json").read_text()
    man = json.loads(text)
    assert str(tmp_path) not in text and str(base) not in (tmp_path / "t" / "o" / "README.md").read_text()
    assert {i["base_model"] for i in man["inputs"].values()} == {"Org/tiny-base"}
    assert man["recipe"]["inputs"] == man["inputs"]
    assert run_cli("verify", "o").exit_code == 0
    assert run_cli("run", "o/vecmerge.json", "--out", "again").exit_code == 0


def test_step_energy_rank_against_dense(toy, run_cli, dense_expr):
    """Issue 12 item 14: --rank step-energy:E keeps, per module, the smallest rank whose cut loses at most
    1 - E of the step's squared norm (dense SVD of base + alpha*dir); energy:E is documented as the whole update."""
    rep = json.loads(run_cli("project", "--base", "v54", "--dir", "v51-v28", "--trust", "0.0113", "--rank",
                             "step-energy:0.999", "--dry-run", "--json").stdout)
    alpha = rep["step"]["alpha"]
    base, d = dense_expr({"v54": 1.0}), dense_expr({"v51": 1.0, "v28": -1.0})
    for m, f in rep["outputs"][0]["figures"]["modules"].items():
        s2 = torch.linalg.svdvals(base[m] + alpha * d[m]) ** 2
        step_sq = float((alpha * d[m]).pow(2).sum())
        want = next(k for k in range(len(s2) + 1) if float(s2[k:].sum()) <= 0.001 * step_sq)
        assert f["rank"] == want and f["cut_error"] ** 2 <= 0.001 * step_sq * (1 + 1e-6)
        assert f["step_norm"] == pytest.approx(step_sq ** 0.5, rel=1e-9)
    assert rep["outputs"][0]["figures"]["residual"] <= 0.001 ** 0.5
    res = run_cli("project", "--base", "v54", "--dir", "v51-v28", "--trust", "0.0113", "--rank", "energy:0.99",
                  "--dry-run")
    assert "step-energy:0.99 measures the step" in res.output  # the warning names the other measure
def test_project_steps_only_in_the_selected_modules(split, run_cli, dense_expr, dense_updates):
    """--only/--exclude: the consensus gate and the step cover the selected modules; the others keep the backbone
    (to the fp32 rounding, rtol 1e-6); alpha comes from the selected direction (rtol 1e-12)."""
    args = ["project", "--base", "v54", "--dir", "v51-v28", "--trust", "0.01", "--consensus-ref", "v54-v54e2"]
    assert run_cli(*args, "--out", "all").exit_code == 1  # the MLP module DISAGREE fails the gate
    res = run_cli(*args, "--only", "self_attn", "--exclude", r"layers\.1\.self_attn\.o", "--out", "attn", "--json")
    assert res.exit_code == 0, res.output
    rep = json.loads(res.output)
    chosen = [m for m in dense_expr({"v54": 1.0}) if "self_attn" in m and "layers.1.self_attn.o" not in m]
    assert rep["consensus"]["modules"] == len(chosen) == 7
    assert rep["selection"]["selected"] == 7 and len(rep["selection"]["left_out"]) == 7
    base, d = dense_expr({"v54": 1.0}), dense_expr({"v51": 1.0, "v28": -1.0})
    alpha = 0.01 * fro(base) / fro({m: d[m] for m in chosen})
    assert rep["step"]["alpha"] == pytest.approx(alpha, rel=1e-12) and rep["step"]["zeroed"] == []
    got = dense_updates(split / "attn")
    for m in base:
        want = base[m] + alpha * d[m] if m in chosen else base[m]
        assert float((got[m] - want).norm() / want.norm()) < 1e-6, m
    man = json.loads((split / "attn" / "vecmerge.json").read_text())
    assert man["resolved"]["selection"]["left_out_means"].startswith("no step")
    assert run_cli("verify", "attn").exit_code == 0


def test_project_multipliers_shape_the_direction_before_alpha(toy, dense_expr, dense_updates):
    rec = {"base": "v54", "dir": "v51 - v28", "trust": 0.01, "multipliers": {"mlp": 0.5}, "out": "half"}
    rep = run(Recipe.from_dict(rec), Workspace())
    base, d = dense_expr({"v54": 1.0}), dense_expr({"v51": 1.0, "v28": -1.0})
    shaped = {m: (0.5 if "mlp" in m else 1.0) * d[m] for m in d}
    alpha = 0.01 * fro(base) / fro(shaped)
    assert rep["step"]["alpha"] == pytest.approx(alpha, rel=1e-12)
    got = dense_updates(toy / "half")
    for m in base:
        want = base[m] + alpha * shaped[m]
        assert float((got[m] - want).norm() / want.norm()) < 1e-6, m
    assert rep["multipliers"] == {m: 0.5 for m in d if "mlp" in m}
    from vecmerge.verify.checks.output import verify_output

    assert verify_output(toy / "half")["passed"]


@pytest.mark.parametrize("noise", [0.0, 0.02])  # 0.0: collinear stacks (Householder bases); 0.02: the implicit lift
@pytest.mark.parametrize("dtype,rank", [("bf16", "exact"), ("fp16", 6), ("fp32", 5)])
def test_figures_match_dense_float64(tmp_path, monkeypatch, dense_expr, dense_updates, noise, dtype, rank):
    """Every figure of an output against dense float64 from the written file: rel_error, dtype_effect, survival,
    residual per module and overall (rtol 1e-8; the dense side differences rounded updates of ~1e-3 relative size,
    so it keeps ~13 digits). The rounding term E = W - R needs the cut R: the dense SVD of T at the same rank."""
    toy_trajectory(tmp_path / "t", factor_noise=noise)
    monkeypatch.chdir(tmp_path / "t")
    rep = run(Recipe.from_dict({"base": "v54", "dir": "v51 - v28", "trust": 0.0113, "rank": rank, "dtype": dtype,
                                "out": "o"}), Workspace())
    fig, alpha = rep["outputs"][0]["figures"], rep["step"]["alpha"]
    base, d = dense_expr({"v54": 1.0}), dense_expr({"v51": 1.0, "v28": -1.0})
    W = dense_updates("o")
    sums = dict(resid=0.0, dtype=0.0, target=0.0, step=0.0, moved=0.0)
    for m, f in fig["modules"].items():
        T, step = base[m] + alpha * d[m], alpha * d[m]
        U, S, Vh = torch.linalg.svd(T, full_matrices=False)
        R = (U[:, :f["rank"]] * S[:f["rank"]]) @ Vh[:f["rank"]]
        resid, rnd = float((W[m] - T).norm()), float((W[m] - R).norm())
        assert rnd > 0  # the rounding is real in every dtype
        assert f["rel_error"] == pytest.approx(resid / float(T.norm()), rel=1e-8), m
        assert f["survival"] == pytest.approx(float(((W[m] - base[m]) * step).sum()) / float(step.norm()) ** 2,
                                              rel=1e-8), m
        for k, v in (("resid", resid**2), ("dtype", rnd**2), ("target", float(T.norm()) ** 2),
                     ("step", float(step.norm()) ** 2), ("moved", float(((W[m] - base[m]) * step).sum()))):
            sums[k] += v
    assert fig["rel_error"] == pytest.approx((sums["resid"] / sums["target"]) ** 0.5, rel=1e-8)
    assert fig["dtype_effect"] == pytest.approx((sums["dtype"] / sums["target"]) ** 0.5, rel=1e-8)
    assert fig["residual"] == pytest.approx((sums["resid"] / sums["step"]) ** 0.5, rel=1e-8)
    assert fig["survival"] == pytest.approx(sums["moved"] / sums["step"], rel=1e-8)


def test_recipe_name_titles_the_model_card(toy, run_cli):
    """Issue 10 item 8a: ``name:`` is the card's heading (kept on one line); without it the output folder's name is."""
    # a YAML single-quoted scalar with a blank line: the name holds a newline
    (toy / "r.yaml").write_text("name: 'v58: small step\n\n  from v54'\nbase: v54\ndir: v51 - v28\ntrust: 0.0113\n"
                                "out: out/named\n")
    res = run_cli("run", "r.yaml")
    assert res.exit_code == 0, res.output
    card = (toy / "out" / "named" / "README.md").read_text()
    assert card.startswith("---\nlibrary_name: peft\n")
    body = card.split("---\n", 2)[2]  # after the front matter
    assert [line for line in body.splitlines() if line.startswith("# ")] == ["# v58: small step from v54"]
    assert body.startswith("# v58: small step from v54\n")
    res = run_cli("project", "--base", "v54", "--dir", "v51-v28", "--trust", "0.0113", "--out", "out/plain")
    assert res.exit_code == 0, res.output
    plain = (toy / "out" / "plain" / "README.md").read_text().split("---\n", 2)[2]
    assert plain.splitlines()[0] == "# plain"


@pytest.mark.parametrize("noise", [0.0, 0.02])
def test_consensus_reference_apart_from_the_basis(tmp_path, monkeypatch, dense_expr, noise):
    """Issue 27: the v58 step's consensus-only input (v54e2) stays out of the step's basis (p = 3 ranks, not 4);
    the gate's rows (inner product, norms, cosine) still match dense float64 to rtol 1e-9, and the direction and
    step are those of a basis that holds it (the same update)."""
    from vecmerge.linalg.subspace import Apart
    from vecmerge.pipeline.evaluation import consensus_rows, evaluate_cores

    toy_trajectory(tmp_path / "t", factor_noise=noise)
    monkeypatch.chdir(tmp_path / "t")
    ev = evaluate_cores(Recipe.from_dict({"base": "v54", "dir": "v51 - v28", "trust": 0.0113,
                                          "consensus": {"ref": "v54 - v54e2"}, "out": "o"}), Workspace())
    ref, d = dense_expr({"v54": 1.0, "v54e2": -1.0}), dense_expr({"v51": 1.0, "v28": -1.0})
    for row in consensus_rows(ev):
        m = row["module"]
        assert isinstance(ev.operands["ref"][m], Apart)
        ranks = sum(ev.vectors[n].modules[m].rank for n in ("v54", "v51", "v28"))
        space, (out, inn) = ev.operands["dir"][m].space, ev.specs[m].shape
        assert (space.p, space.q) == (min(ranks, out), min(ranks, inn))  # v54e2 is not in the basis
        inner, rn, dn = float((ref[m] * d[m]).sum()), float(ref[m].norm()), float(d[m].norm())
        assert row["inner"] == pytest.approx(inner, rel=1e-9)
        assert row["ref_norm"] == pytest.approx(rn, rel=1e-9) and row["dir_norm"] == pytest.approx(dn, rel=1e-9)
        assert row["cosine"] == pytest.approx(inner / (rn * dn), rel=1e-9)
