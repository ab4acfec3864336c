"""Fixtures of the outputs/ tests."""

from __future__ import annotations

import pytest
from staged_outputs import write_output

from vecmerge.outputs.policy import OutputPolicy


@pytest.fixture
def ws(tmp_path, monkeypatch):
    """A workspace-like tree: inputs v28, v51 (named by the workspace), base, and the user's notes."""
    monkeypatch.chdir(tmp_path)
    for name in ("v28", "v51", "v54"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "adapter_config.json").write_text("{}")
        (tmp_path / name / "adapter_model.safetensors").write_bytes(b"weights")
    write_output(tmp_path / "v51", "earlier-vecmerge-output")  # a vecmerge output the workspace names
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "config.json").write_text("{}")
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("my notes")
    policy = OutputPolicy.for_command(inputs=["v28"], workspace_adapters={"v28": tmp_path / "v28",
                                      "v51": tmp_path / "v51", "v54": tmp_path / "v54"},
                                      base_model=tmp_path / "base", force=True)
    return tmp_path, policy
