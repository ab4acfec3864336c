"""``verify`` catches a 0.01% edit of one module of an output of every registered method (issue 36, item 1).

The tamperer scales one module's ``lora_B`` by ``1 + 1e-4`` (10x fp32's update tolerance of 1e-5) and writes
the new weights' sha256 into the manifest, so the hash check alone cannot catch it: the update itself must be
re-derived. The parametrization covers the whole method registry (checked against ``methods.names()``), and the
inputs the independent path may not read: ``rank keep-base``, DoRA, MoE experts and ``lora_bias``. A clean
output of each passes first (the same checks, no tolerance loosened). Every registered method and keep-base
is covered by verify's own float64 path: its ``independent`` row re-derives the update (no ``not_independent``
note) and itself fails on the edit (lora_bias and DoRA inputs too); MoE expert inputs are not yet (``own=False``).

Why 1e-4 is caught on a rank-cut output: an optimal (or range-finder) cut is ``W = P_W I``, so the cut's error
``||I - W||`` moves only to second order under an edit inside W's column space (a scaled factor); verify's update
check also requires ``||W - P_W I|| <= tol ||I||``, first order in any edit (``verify.update``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from vecmerge import methods
from vecmerge.testing import forge_tensor, toy_trajectory

MODULE = "model.layers.1.self_attn.v_proj"
PREFIX = "base_model.model."
DENSE = ("--density", "0.5", "--rank", "8")
TWO = ("v54", "v51")

# every registered method: the CLI that writes an output of it from the toy trajectory
BY_METHOD = {
    "add": ("project", "--base", "v54", "--dir", "v51-v28", "--trust", "0.05"),
    "onto-ref": ("project", "--base", "v54", "--dir", "v51-v28", "--trust", "0.05", "--mode", "onto-ref",
                 "--consensus-ref", "v54-v54e2", "--on-disagree", "keep"),
    "orthogonal": ("project", "--base", "v54", "--dir", "v51-v28", "--trust", "0.05", "--mode", "orthogonal"),
    "expression": ("refactor", "0.5*v54 + 0.5*v51", "--rank", "4"),
    **{m: ("merge", "--method", m, *TWO, *DENSE) for m in ("breadcrumbs", "breadcrumbs_ties", "dare_linear",
                                                           "dare_ties", "della", "della_linear", "magnitude_prune",
                                                           "ties")},
    "sce": ("merge", "--method", "sce", *TWO, "--rank", "8"),
    "knots": ("merge", "--method", "knots", *TWO, "--density", "0.5"),
    "slerp": ("merge", "--method", "slerp", *TWO, "--t", "0.3"),
    "svd": ("merge", "--method", "svd", *TWO, "--rank", "4"),
    **{m: ("merge", "--method", m, *TWO) for m in ("linear", "cat", "iso_c", "iso_cts", "karcher", "model_stock",
                                                   "multislerp", "nuslerp", "svc", "task_arithmetic", "tsv_m")},
}
SHARED_DIRECTIONS = ("tsv_m",)  # trained adapters (factor noise), where the merge is one update, not many
MORE = {"keep-base": ("project", "--base", "v54", "--dir", "v51-v28", "--trust", "0.05", "--rank", "keep-base")}


def verdict(run_cli, out, *extra) -> tuple[int, dict]:
    res = run_cli("verify", out, "--json", *extra)
    return res.exit_code, {c["name"]: c for c in json.loads(res.stdout)["checks"]}


def assert_caught(run_cli, out: Path, module: str, named: str, *extra, own: bool = True) -> None:
    """Clean: every check passes. Tampered (re-pinned): exit 1, only update-level checks fail, naming the module.

    ``own``: verify's own path covers the recipe: the clean report has a passing ``independent`` row that says
    it re-derived the update by that path (and no ``not_independent`` note), and that row itself catches the edit.
    """
    res = run_cli("verify", out, "--json", *extra)
    report = json.loads(res.stdout)
    checks = {c["name"]: c for c in report["checks"]}
    assert res.exit_code == 0, {n: c["detail"] for n, c in checks.items() if not c["passed"]}
    if own:
        assert "not_independent" not in report, report.get("not_independent")
        assert checks["independent"]["passed"] is True, checks["independent"]
        assert "re-derived by verify's own float64 path" in checks["independent"]["detail"]
    forge_tensor(out, f"{module}.lora_B.weight", lambda t: t * (1 + 1e-4))
    code, checks = verdict(run_cli, out, *extra)
    failed = {n: c["detail"] for n, c in checks.items() if not c["passed"]}
    assert code == 1 and checks["output sha256"]["passed"], failed  # the hash alone does not catch it
    assert failed and set(failed) <= {"update", "independent", "step", "peft load", "logits"}, failed
    assert any(named in d for d in failed.values()), failed
    if own:
        assert checks["independent"]["passed"] is False and named in checks["independent"]["detail"], failed


def test_the_cases_cover_the_whole_registry():
    assert set(BY_METHOD) == set(methods.names())


@pytest.mark.parametrize("case", sorted(BY_METHOD) + sorted(MORE))
def test_verify_catches_a_repinned_0_01_percent_edit_of_every_method(toy, run_cli, case):
    args = {**BY_METHOD, **MORE}[case]
    if case in SHARED_DIRECTIONS:  # checkpoints that repeat factors exactly make TSV-M's polar factor not unique
        toy_trajectory(toy, factor_noise=0.02)
    res = run_cli(*args, "--out", "o")
    assert res.exit_code == 0, res.output
    assert_caught(run_cli, toy / "o", MODULE, MODULE)


@pytest.mark.slow
@pytest.mark.parametrize("method", ["linear", "ties"])
def test_verify_catches_a_repinned_edit_of_a_dora_merge(tmp_path, monkeypatch, peft_adapter, tiny_base, run_cli,
                                                        method):
    monkeypatch.chdir(tmp_path)
    d, lo = peft_adapter("vc_dora", 3, use_dora=True), peft_adapter("vc_plain", 4)
    (tmp_path / "vecmerge.yaml").write_text(json.dumps({"adapters": {"d": str(d), "l": str(lo)}}))
    extra = ("--density", "0.5", "--rank", "8") if method == "ties" else ()
    res = run_cli("merge", "--method", method, "d", "l", *extra, "--base-model", tiny_base, "--out", "o")
    assert res.exit_code == 0, res.output
    assert_caught(run_cli, tmp_path / "o", MODULE, MODULE)  # DoRA: re-derived with the base model's weights


@pytest.mark.slow
def test_verify_catches_a_repinned_edit_of_a_lora_bias_merge(tmp_path, monkeypatch, hf_base, peft_on, run_cli):
    base = hf_base("llama_bias")
    monkeypatch.chdir(tmp_path)
    made = {n: peft_on(base, tmp_path / "in" / n, seed, target_modules=["q_proj", "v_proj"], lora_bias=True)
            for n, seed in (("a", 1), ("b", 2))}
    (tmp_path / "vecmerge.yaml").write_text(json.dumps({"adapters": {n: str(p) for n, p in made.items()}}))
    res = run_cli("merge", "--method", "linear", "a", "b", "--weights", "0.6,0.4", "--out", "o")
    assert res.exit_code == 0, res.output
    assert_caught(run_cli, tmp_path / "o", MODULE, MODULE)  # lora_bias: weights and biases on verify's own path


def _toy_experts(folder: Path, seed: int) -> Path:
    """A hand-written folder in PEFT's ``target_parameters`` layout: per layer a q_proj and 4 experts' down_proj."""
    g = torch.Generator().manual_seed(seed)
    t = {}
    for i in range(2):
        p = f"{PREFIX}model.layers.{i}"
        t |= {f"{p}.self_attn.q_proj.lora_A.weight": torch.randn(2, 8, generator=g) * 0.1,
              f"{p}.self_attn.q_proj.lora_B.weight": torch.randn(8, 2, generator=g) * 0.1,
              f"{p}.mlp.experts.lora_A.weight": torch.randn(8, 6, generator=g) * 0.1,  # 4 experts, r=2
              f"{p}.mlp.experts.lora_B.weight": torch.randn(8, 8, generator=g) * 0.1}
    folder.mkdir(parents=True)
    save_file(t, str(folder / "adapter_model.safetensors"), metadata={"format": "pt"})
    (folder / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": "toy-moe", "r": 2,
        "lora_alpha": 4, "target_modules": ["q_proj"], "target_parameters": ["down_proj"], "use_rslora": False,
        "lora_dropout": 0.0, "bias": "none", "fan_in_fan_out": False}))
    return folder


@pytest.mark.parametrize("rank", ["exact", "2"])
def test_verify_catches_a_repinned_edit_of_an_expert_output(tmp_path, monkeypatch, run_cli, rank):
    monkeypatch.chdir(tmp_path)
    for seed, name in enumerate(("v28", "v51", "v54")):
        _toy_experts(tmp_path / name, seed)
    res = run_cli("project", "--base", "v54", "--dir", "v51-v28", "--trust", "0.05", "--rank", rank, "--out", "o")
    assert res.exit_code == 0, res.output
    assert_caught(run_cli, tmp_path / "o", "model.layers.1.mlp.experts", "model.layers.1.mlp.experts.down_proj",
                  own=False)  # MoE experts: not yet on verify's own path
