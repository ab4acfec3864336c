"""Regression tests for defects found in review: each must be refused cleanly or handled exactly."""

import json
import shutil

import pytest

from vecmerge.export import _patterns
from vecmerge.peft_format import LoraConfig
from vecmerge.testing import llm_shapes, toy_adapter, tree_hashes


def test_out_may_not_be_an_input_or_inside_one(toy, run_cli):
    shutil.copytree(toy / "v28", toy / "av")
    before = tree_hashes(toy)
    for out in ("av", "av/sub", "."):
        res = run_cli("refactor", "av + v51", "--out", out, "--force")
        assert res.exit_code == 2 and "would overwrite input" in res.output, (out, res.output)
    assert tree_hashes(toy) == before


def test_fp16_overflow_is_refused_and_underflow_warns(toy, run_cli):
    res = run_cli("refactor", "1e12*v28", "--dtype", "fp16", "--out", "big")
    assert res.exit_code == 2 and "overflow fp16" in res.output and not (toy / "big").exists()
    assert not list(toy.glob(".big.*"))
    res = run_cli("refactor", "1e-14*v28", "--dtype", "fp16", "--out", "tiny", "--json")
    rep = json.loads(res.output)
    assert any("rounding to fp16 moved the update" in w for w in rep["outputs"][0]["warnings"])


def test_zero_direction_or_backbone_with_trust(toy, run_cli):
    res = run_cli("project", "--base", "v54", "--dir", "v51-v51", "--trust", "0.01", "--out", "z")
    assert res.exit_code == 2 and "direction is zero" in res.output and not (toy / "z").exists()
    res = run_cli("project", "--base", "v54-v54", "--dir", "v51-v28", "--trust", "0.01", "--out", "z")
    assert res.exit_code == 2 and "backbone is zero" in res.output and "--alpha" in res.output


@pytest.mark.parametrize("args, match", [
    (["--alpha", "nan"], "alpha=nan: a finite number"),
    (["--trust", "inf"], "trust=inf: a finite number"),
    (["--alpha", "0.1", "--dose", "1,inf"], "dose="),
])
def test_non_finite_numbers_are_refused(toy, run_cli, args, match):
    res = run_cli("project", "--base", "v54", "--dir", "v51-v28", *args, "--out", "n")
    assert res.exit_code == 2 and match in res.output and "internal error" not in res.output


def test_out_of_range_number_in_an_expression(toy, run_cli):
    res = run_cli("refactor", "1e400*v28", "--out", "n")
    assert res.exit_code == 2 and "out of range" in res.output


def test_duplicate_doses_are_refused_before_writing(toy, run_cli):
    res = run_cli("project", "--base", "v54", "--dir", "v51-v28", "--trust", "0.01", "--dose", "1,1.0", "--out", "d")
    assert res.exit_code == 2 and "same folder" in res.output and not (toy / "d-x1").exists()


def test_rank_patterns_for_names_that_end_in_each_other():
    ranks = {"model.layers.0.mlp.up_proj": 1, "mtp.model.layers.0.mlp.up_proj": 2, "model.layers.1.mlp.up_proj": 2}
    alphas = {m: float(r) for m, r in ranks.items()}
    r0, a0, rp, ap = _patterns(ranks, alphas)
    cfg = LoraConfig(r=r0, lora_alpha=a0, rank_pattern=rp, alpha_pattern=ap)
    assert all(cfg.resolve(m) == (ranks[m], alphas[m]) for m in ranks)


def test_adapters_of_different_models_are_refused_even_with_allow_missing(tmp_path, run_cli, monkeypatch):
    monkeypatch.chdir(tmp_path)
    toy_adapter("qwen", shapes=llm_shapes(1, 32, 48, 4, 2, 8))
    toy_adapter("gpt", shapes={"transformer.h.0.attn.c_attn": (96, 32)}, seed=1)
    res = run_cli("refactor", "qwen + gpt", "--out", "o", "--allow-missing")
    assert res.exit_code == 2 and "share no module" in res.output


def test_unparsable_dir_reports_only_the_parse_error(toy, run_cli):
    res = run_cli("project", "--base", "v54", "--dir", "v51 - (v28", "--trust", "0.01", "--out", "o")
    assert res.exit_code == 2 and "expected ')'" in res.output and "only meaningful" not in res.output


def test_verify_with_base_model_on_embedding_lora(tiny_base, peft_adapter, run_cli, tmp_path, monkeypatch):
    a = peft_adapter("rv_emb", seed=5, target_modules=["q_proj", "embed_tokens"])
    monkeypatch.chdir(tmp_path)
    (tmp_path / "vecmerge.yaml").write_text(f"adapters:\n  e: {a}\n")
    assert run_cli("refactor", "0.5*e", "--out", "o").exit_code == 0
    res = run_cli("verify", "o", "--base-model", tiny_base)
    assert res.exit_code == 0, res.output
    assert "PASSED" in res.output
