"""Names resolve through vecmerge.yaml or folders; expressions evaluate exactly in factored form."""

import pytest
import torch

from vecmerge.errors import AlignmentError, ExpressionError, WorkspaceError
from vecmerge.testing import llm_shapes, toy_adapter
from vecmerge.workspace import Workspace


def test_names_resolve_and_evaluate_exactly(toy):
    ws = Workspace()
    assert ws.path_of("v54") == (toy / "v54").resolve()
    tv = ws.evaluate("v54 + 0.5*(v51 - v28)")
    a = {n: ws.adapter(n) for n in ("v54", "v51", "v28")}
    for m in tv:
        ref = a["v54"].factors(m).dense() + 0.5 * (a["v51"].factors(m).dense() - a["v28"].factors(m).dense())
        torch.testing.assert_close(tv[m].dense(), ref, rtol=1e-12, atol=1e-14)


def test_workspace_file_relative_paths(tmp_path, monkeypatch):
    toy_adapter(tmp_path / "runs" / "a1")
    (tmp_path / "ws.yaml").write_text("adapters:\n  alpha1: runs/a1\n")
    monkeypatch.chdir(tmp_path / "runs")
    ws = Workspace(tmp_path / "ws.yaml")
    assert ws.path_of("alpha1") == (tmp_path / "runs" / "a1").resolve()
    assert ws.path_of("a1") == (tmp_path / "runs" / "a1").resolve()  # a folder in the cwd
    with pytest.raises(ExpressionError, match="'nope' is not an adapter name"):
        ws.path_of("nope")


@pytest.mark.parametrize("text, match", [
    ("adapters: [a, b]\n", "'adapters' must map names"),
    ("adapters: {a-b: x}\n", "must match"),
    ("adaptors: {a: x}\n", "unknown key"),
    ("adapters: {a: [\n", "not valid YAML"),
])
def test_bad_workspace(tmp_path, text, match):
    (tmp_path / "vecmerge.yaml").write_text(text)
    with pytest.raises(WorkspaceError, match=match):
        Workspace(root=tmp_path)


def test_different_bases_and_missing_modules(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    toy_adapter("a", shapes=llm_shapes(2, 32, 48, 4, 2, 8))
    toy_adapter("b", shapes=llm_shapes(2, 64, 48, 4, 2, 16))
    toy_adapter("c", shapes=llm_shapes(1, 32, 48, 4, 2, 8))
    ws = Workspace()
    with pytest.raises(AlignmentError, match="different base models"):
        ws.evaluate("a - b")
    with pytest.raises(AlignmentError, match="c lacks 7 module.*--allow-missing"):
        ws.evaluate("a - c")
    tv = ws.evaluate("a - c", allow_missing=True)
    m = "model.layers.1.mlp.up_proj"
    torch.testing.assert_close(tv[m].dense(), ws.adapter("a").factors(m).dense(), rtol=0, atol=0)
