"""Base models: adapters of different models are not mixed, and verify loads the model the output declares.

Real adapters saved by PEFT on two tiny architectures of equal shapes (Llama and Mistral, built from
configs and saved to folders): their modules and shapes match exactly, only the declared
``base_model_name_or_path`` tells them apart. Numbers (the allowed merge) are compared with a dense
float64 reference (``dense_expr``): relative Frobenius error below 1e-6 (fp32 storage gives ~4e-8).
"""

import json
import os
from pathlib import Path

import pytest
import torch

from vecmerge.testing import toy_adapter
from vecmerge.workspace.base_model import canonical, folder_is, model_folder_problem

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@pytest.fixture
def mixed(tmp_path, monkeypatch, hf_base, peft_on):
    """A workspace with l1, l2 (Llama adapters) and m1 (a Mistral adapter of the very same shapes)."""
    llama, mistral = hf_base("llama"), hf_base("mistral")
    for name, base, seed in (("l1", llama, 1), ("l2", llama, 2), ("m1", mistral, 3)):
        peft_on(base, tmp_path / name, seed, target_modules=TARGETS)
    (tmp_path / "vecmerge.yaml").write_text("adapters: {l1: l1, l2: l2, m1: m1}\n")
    monkeypatch.chdir(tmp_path)
    return tmp_path, llama, mistral


def test_canonical_compares_folders_by_their_resolved_path(tmp_path, monkeypatch):
    (tmp_path / "models" / "base").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert canonical("models/base") == canonical(str(tmp_path / "models" / "base")) == canonical("./models/base/")
    assert canonical("Qwen/Qwen3-0.6B") == "Qwen/Qwen3-0.6B" != canonical("Qwen/Qwen3-1.7B")
    assert canonical(None) is None and canonical("  ") is None
    snap = tmp_path / "hub" / "models--Qwen--Qwen3-0.6B" / "snapshots" / "abc"
    snap.mkdir(parents=True)
    assert folder_is(snap, "Qwen/Qwen3-0.6B") and not folder_is(snap, "Qwen/Qwen3-1.7B")
    assert folder_is(tmp_path / "models" / "base", "Qwen/Qwen3-0.6B", {tmp_path / "models/base": "Qwen/Qwen3-0.6B"})


@pytest.mark.slow
def test_adapters_of_different_base_models_are_refused_naming_both(mixed, run_cli):
    root, llama, mistral = mixed
    for args in (["project", "--base", "l1", "--dir", "m1 - l2", "--trust", "0.01", "--out", "o"],
                 ["refactor", "l1 + m1", "--out", "o"],
                 ["audit", "--ref", "l1 - l2", "--dir", "m1 - l2"],
                 ["audit", "l1", "m1"]):
        res = run_cli(*args)
        assert res.exit_code == 2, (args, res.output)
        assert "different base models" in res.output and str(llama) in res.output and str(mistral) in res.output
        assert "--allow-base-mismatch" in res.output and len(res.output.strip().splitlines()) == 1
    assert not (root / "o").exists()


@pytest.mark.slow
def test_allow_base_mismatch_is_recorded_and_warned(mixed, run_cli, dense_expr, dense_updates):
    root, llama, mistral = mixed
    res = run_cli("project", "--base", "l1", "--dir", "m1 - l2", "--trust", "0.01", "--out", "o",
                  "--allow-base-mismatch", "--json")
    assert res.exit_code == 0, res.output
    rep = json.loads(res.stdout)
    assert any("different base models" in w for w in rep["outputs"][0]["warnings"])
    man = json.loads((root / "o" / "vecmerge.json").read_text())
    assert man["recipe"]["allow_base_mismatch"] is True
    rel = {b: os.path.relpath(b, root) for b in (llama, mistral)}  # relative to the workspace (issue 36 item 8)
    assert {n: i["base_model"] for n, i in man["inputs"].items()} == {"l1": rel[llama], "m1": rel[mistral],
                                                                      "l2": rel[llama]}
    alpha = man["resolved"]["alpha"]
    want = dense_expr({"l1": 1.0, "m1": alpha, "l2": -alpha})
    got = dense_updates(root / "o")
    for m, w in want.items():  # relative Frobenius error of fp32 storage: ~4e-8
        assert float(torch.linalg.norm(got[m] - w) / torch.linalg.norm(w)) < 1e-6, m
    assert run_cli("verify", "o").exit_code == 0  # the manifest re-derives with the recorded override
    text = run_cli("audit", "--ref", "l1 - l2", "--dir", "m1 - l2", "--allow-base-mismatch").output
    assert "warning: the inputs declare different base models" in text


def test_same_base_model_spelled_two_ways_is_accepted(tmp_path, monkeypatch, run_cli):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models" / "base").mkdir(parents=True)
    toy_adapter("a", base_model=str(tmp_path / "models" / "base"))
    toy_adapter("b", base_model="models/base/", seed=1)
    toy_adapter("c", base_model="Org/other", seed=2)
    assert run_cli("refactor", "a - b", "--out", "o").exit_code == 0
    res = run_cli("refactor", "a - c", "--out", "o2")
    assert res.exit_code == 2 and "a names" in res.output and "c names Org/other" in res.output


@pytest.mark.slow
def test_verify_refuses_the_wrong_base_model_and_adapter_folders(mixed, run_cli):
    root, llama, mistral = mixed
    assert run_cli("project", "--base", "l1", "--dir", "l2 - l1", "--trust", "0.01", "--out", "o").exit_code == 0
    res = run_cli("verify", "o", "--base-model", mistral, "--json")
    assert res.exit_code == 1
    checks = {c["name"]: c for c in json.loads(res.stdout)["checks"]}
    assert not checks["base model"]["passed"] and "NOT the base model" in checks["base model"]["detail"]
    assert str(llama) in checks["base model"]["detail"] and "not run" in checks["peft load"]["detail"].lower()
    res = run_cli("verify", "o", "--base-model", root / "l1")
    assert res.exit_code == 2 and "is a LoRA adapter folder" in res.output
    (root / "empty").mkdir()
    (root / "empty" / "config.json").write_text("{}")
    res = run_cli("verify", "o", "--base-model", root / "empty")
    assert res.exit_code == 2 and "no weights" in res.output
    res = run_cli("verify", "o", "--base-model", mistral, "--allow-base-mismatch", "--json")
    checks = {c["name"]: c for c in json.loads(res.stdout)["checks"]}
    assert checks["base model"]["passed"] and "NOT the base model" in checks["base model"]["detail"]
    assert "peft load" in checks and checks["peft load"]["passed"]
    res = run_cli("verify", "o", "--base-model", llama, "--json")
    checks = {c["name"]: c for c in json.loads(res.stdout)["checks"]}
    assert res.exit_code == 0 and "is the base model the output declares" in checks["base model"]["detail"]


@pytest.mark.slow
def test_verify_defaults_to_the_workspace_base_model_and_its_hub_id(mixed, run_cli):
    root, llama, _ = mixed
    rel = os.path.relpath(llama, root)
    (root / "vecmerge.yaml").write_text(f"base_model: {rel}\nbase_model_id: Org/tiny-llama\n"
                                        "adapters: {l1: l1, l2: l2, m1: m1}\n")
    assert run_cli("project", "--base", "l1", "--dir", "l2 - l1", "--trust", "0.01", "--out", "o").exit_code == 0
    cfg = json.loads((root / "o" / "adapter_config.json").read_text())
    assert cfg["base_model_name_or_path"] == "Org/tiny-llama"
    res = run_cli("verify", "o", "--json")  # --base-model from vecmerge.yaml, which names it Org/tiny-llama
    checks = {c["name"]: c for c in json.loads(res.stdout)["checks"]}
    assert res.exit_code == 0 and checks["base model"]["passed"] and checks["peft load"]["passed"]


def test_model_folder_problem(tmp_path):
    assert model_folder_problem(tmp_path / "nope") == "no such folder"
    (tmp_path / "m").mkdir()
    assert "no config.json" in model_folder_problem(tmp_path / "m")
    (tmp_path / "m" / "config.json").write_text("{}")
    assert "no weights" in model_folder_problem(tmp_path / "m")
    (tmp_path / "m" / "model-00001-of-00002.safetensors").write_bytes(b"")
    assert model_folder_problem(Path(tmp_path / "m")) is None


@pytest.mark.slow
def test_verify_reads_a_relative_declared_base_from_the_workspace(tmp_path, monkeypatch, hf_base, peft_on, run_cli):
    """PEFT records the base path as the trainer typed it (often relative): verify from another folder still
    recognises it, starting from the workspace the output was made in."""
    import shutil

    ws = tmp_path / "ws"
    (ws / "models").mkdir(parents=True)
    shutil.copytree(hf_base("llama"), ws / "models" / "llama")
    monkeypatch.chdir(ws)
    for name, seed in (("a", 1), ("b", 2)):
        peft_on(Path("models/llama"), ws / name, seed, target_modules=TARGETS)
    assert json.loads((ws / "a" / "adapter_config.json").read_text())["base_model_name_or_path"] == "models/llama"
    assert run_cli("project", "--base", "a", "--dir", "b - a", "--trust", "0.01", "--out", "out/o").exit_code == 0
    monkeypatch.chdir(tmp_path)
    res = run_cli("verify", ws / "out" / "o", "--base-model", ws / "models" / "llama", "--json")
    checks = {c["name"]: c for c in json.loads(res.stdout)["checks"]}
    assert res.exit_code == 0 and checks["base model"]["passed"] and checks["peft load"]["passed"]


def test_a_relative_declared_base_starts_from_the_workspace(tmp_path, monkeypatch, run_cli):
    """A base declared relative (as the trainer typed it) and one declared absolute are the same model when the
    relative one resolves from the workspace folder, even when the command runs elsewhere."""
    ws = tmp_path / "ws"
    (ws / "models" / "base").mkdir(parents=True)
    toy_adapter(ws / "a", base_model="models/base")
    toy_adapter(ws / "b", base_model=str(ws / "models" / "base"), seed=1)
    toy_adapter(ws / "c", base_model="models/other", seed=2)
    (ws / "vecmerge.yaml").write_text("adapters: {a: a, b: b, c: c}\n")
    monkeypatch.chdir(tmp_path)
    assert run_cli("--workspace", ws / "vecmerge.yaml", "refactor", "a - b", "--out", "o").exit_code == 0
    assert run_cli("--workspace", ws / "vecmerge.yaml", "refactor", "a - c", "--out", "o2").exit_code == 2
