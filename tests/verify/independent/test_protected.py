"""verify re-derives a protected step on its own (its hooks, numpy eigh): edits of the update or figures fail."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from vecmerge.verify.checks.output import verify_output
from vecmerge.verify.checks.protected_capture import capture_inputs
from vecmerge.verify.independent.protected import energy_basis


def _prompts(path: Path, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    path.write_text("".join(json.dumps({"id": i, "prompt_ids": torch.randint(0, 96, (5,), generator=g).tolist(),
                                        "target_ids": torch.randint(0, 96, (3,), generator=g).tolist()}) + "\n"
                            for i in range(6)))


@pytest.fixture
def protected_out(tmp_path, monkeypatch, tiny_base, peft_adapter, run_cli):
    names = {"a": peft_adapter("vprot_a", seed=81), "b": peft_adapter("vprot_b", seed=82),
             "c": peft_adapter("vprot_c", seed=83)}
    monkeypatch.chdir(tmp_path)
    (tmp_path / "vecmerge.yaml").write_text("adapters:\n" + "".join(f"  {k}: {v}\n" for k, v in names.items())
                                            + f"base_model: {tiny_base}\n")
    _prompts(tmp_path / "keep.jsonl", 1)
    _prompts(tmp_path / "goal.jsonl", 2)
    res = run_cli("project", "--base", "a", "--dir", "b - c", "--trust", "0.05", "--protect", "keep=keep.jsonl",
                  "--target", "goal=goal.jsonl", "--out", "po")
    assert res.exit_code == 0, res.output
    return tmp_path / "po", tiny_base


def _row(report, name: str) -> dict:
    return next(c for c in report.checks if c["name"] == name)


def _copy(out: Path, to: str) -> Path:
    dst = out.parent / to
    shutil.copytree(out, dst)
    return dst


def test_verify_re_derives_a_protected_step_and_says_so_without_a_base_model(protected_out):
    """With the base model every check passes, protection among them; without one it is not re-derived (a fail)."""
    out, base = protected_out
    rep = verify_output(out, base_model=base)
    assert rep.passed, [c for c in rep.checks if not c["passed"]]
    assert "numpy eigh" in _row(rep, "protection")["detail"]
    bare = verify_output(out)
    assert not bare.passed
    assert "protected step not re-derived" in _row(bare, "protection")["detail"]


@pytest.mark.parametrize("edit", ["kept_drift", "kept_change", "kept_direction", "rank", "sha256", "energy"])
def test_verify_catches_each_edited_protection_figure(protected_out, edit):
    """Each figure of the manifest's protection, edited, fails the protection check by name."""
    out, base = protected_out
    dst = _copy(out, f"edited_{edit}")
    man = json.loads((dst / "vecmerge.json").read_text())
    p = man["protection"]
    field = {"kept_drift": "protect.keep.kept_drift", "kept_change": "target.goal.kept_change",
             "kept_direction": "kept_direction", "rank": "ranks", "sha256": "protect.keep.sha256",
             "energy": "energy"}[edit]
    if edit == "kept_drift":
        p["protect"]["keep"]["kept_drift"] *= 1.001
    elif edit == "kept_change":
        p["target"]["goal"]["kept_change"] *= 1.001
    elif edit == "kept_direction":
        p["kept_direction"] *= 1.001
    elif edit == "rank":
        m = next(iter(p["ranks"]))
        p["ranks"][m] += 1
    elif edit == "sha256":
        p["protect"]["keep"]["sha256"] = "0" * 64
    else:
        p["energy"] = 0.91
    (dst / "vecmerge.json").write_text(json.dumps(man))
    row = _row(verify_output(dst, base_model=base), "protection")
    assert not row["passed"] and f"protection.{field}" in row["detail"], row


def test_verify_catches_a_small_change_of_a_protected_output(protected_out):
    """The written A moved by 0.1% inside span U (W x for protected x changes by 0.1%): the independent check fails."""
    out, base = protected_out
    dst = _copy(out, "nudged")
    man = json.loads((dst / "vecmerge.json").read_text())
    m = next(iter(man["protection"]["ranks"]))
    sd = load_file(str(dst / "adapter_model.safetensors"))
    key = next(k for k in sd if k.endswith(f"{m}.lora_A.weight"))
    grams, _ = capture_inputs(base, {}, {"keep": str(dst.parent / "keep.jsonl")}, [m])
    U = torch.from_numpy(np.ascontiguousarray(energy_basis(grams["keep"][m], 0.9)))
    A = sd[key].double()
    sd[key] = (A + 1e-3 * (A @ U) @ U.T).float().contiguous()
    save_file(sd, str(dst / "adapter_model.safetensors"), metadata={"format": "pt"})
    rep = verify_output(dst, base_model=base)
    row = _row(rep, "independent")
    assert not row["passed"] and "do not hold the intended update" in row["detail"], row


def test_verify_re_derives_a_sketched_capture_and_catches_an_edited_bound(tmp_path, monkeypatch, tiny_base,
                                                                          peft_adapter, run_cli):
    """Inputs wider than exact_width (here 16) on more than 2 l rows (l 4) are sketched: the manifest records each
    with its bound, the text says so, verify runs its own Frequent Directions and passes; an edited bound fails."""
    import vecmerge.probe.inputs as inputs

    monkeypatch.setattr(inputs, "EXACT_WIDTH", 16)
    monkeypatch.setattr(inputs, "SKETCH_ROWS", 4)
    names = {"a": peft_adapter("vprot_a", seed=81), "b": peft_adapter("vprot_b", seed=82)}
    monkeypatch.chdir(tmp_path)
    (tmp_path / "vecmerge.yaml").write_text("adapters:\n" + "".join(f"  {k}: {v}\n" for k, v in names.items())
                                            + f"base_model: {tiny_base}\n")
    _prompts(tmp_path / "keep.jsonl", 1)
    res = run_cli("project", "--base", "a", "--dir", "b - a", "--trust", "0.05", "--protect", "keep=keep.jsonl",
                  "--out", "sk")
    assert res.exit_code == 0, res.output
    assert "Frequent Directions" in res.output
    man = json.loads((tmp_path / "sk" / "vecmerge.json").read_text())
    sk = man["protection"]["inputs"]
    assert sk["exact_width"] == 16 and sk["sketch_rows"] == 4
    assert set(sk["sketched"]) == set(man["protection"]["ranks"])  # every module reads a 32- or 64-wide input
    assert all(0.0 < v["keep"]["bound"] < 1.0 and v["keep"]["rows"] == 48 for v in sk["sketched"].values())
    rep = verify_output(tmp_path / "sk", base_model=tiny_base)
    assert rep.passed, [c for c in rep.checks if not c["passed"]]
    dst = _copy(tmp_path / "sk", "sk_edited")
    m = next(iter(sk["sketched"]))
    man["protection"]["inputs"]["sketched"][m]["keep"]["bound"] *= 1.01
    (dst / "vecmerge.json").write_text(json.dumps(man))
    row = _row(verify_output(dst, base_model=tiny_base), "protection")
    assert not row["passed"] and f"protection.inputs.sketched.{m}.keep.bound" in row["detail"], row
