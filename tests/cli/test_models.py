"""``vecmerge fuse`` and ``extract`` flags (``cli/models.py``)."""

from __future__ import annotations

import json

import torch
from safetensors.torch import save_file

from vecmerge.testing import toy_adapter

Q = "model.layers.0.self_attn.q_proj"


def test_fuse_takes_a_workspace_name(tmp_path, monkeypatch, run_cli):
    """Issue 23: ``vecmerge fuse v28`` said "v28: no such adapter folder"; a name resolves as every command's does."""
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "config.json").write_text(json.dumps({"model_type": "llama"}))
    save_file({Q + ".weight": torch.randn(16, 8)}, str(tmp_path / "base" / "model.safetensors"))
    toy_adapter(tmp_path / "runs" / "v28", shapes={Q: (16, 8)}, rank=2)
    (tmp_path / "vecmerge.yaml").write_text("base_model: base\nadapters:\n  v28: runs/v28\n")
    monkeypatch.chdir(tmp_path)
    r = run_cli("fuse", "v28", "--out", "fz0")
    assert r.exit_code == 0, r.output
    man = json.loads((tmp_path / "fz0" / "vecmerge.json").read_text())
    assert man["inputs"]["adapter"]["path"] == "runs/v28" and man["workspace"] == ".."  # relative to the workspace
    assert run_cli("verify", "fz0").exit_code == 0
    r = run_cli("fuse", "v29", "--out", "fz1")
    assert r.exit_code == 2 and "'v29' is not an adapter name in" in r.output and "nor a folder" in r.output
