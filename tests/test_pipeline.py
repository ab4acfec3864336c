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
from safetensors.torch import load_file

from vecmerge.errors import CheckFailed
from vecmerge.pipeline import run as _run
from vecmerge.recipe import Recipe
from vecmerge.testing import toy_trajectory, tree_hashes
from vecmerge.workspace import Workspace

DISAGREE = "model.layers.1.mlp.up_proj"


def run(*args, **kwargs) -> dict:
    return _run(*args, **kwargs).to_dict()


def fro(d):
    return math.sqrt(sum(float((x**2).sum()) for x in d.values()))


@pytest.fixture
def split(tmp_path, monkeypatch):
    root = tmp_path / "split"
    toy_trajectory(root, disagree=(DISAGREE,))
    monkeypatch.chdir(root)
    return root


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
