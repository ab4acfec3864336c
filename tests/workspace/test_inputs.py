"""workspace.inputs: the one way named inputs are opened, their base models checked and their modules aligned.

Values are checked against the adapters' own factors (``Adapter.factors``) and hand-counted module sets.
"""

import json

import pytest
import torch

from vecmerge.errors import AlignmentError
from vecmerge.expr import parse
from vecmerge.testing import llm_shapes, toy_adapter
from vecmerge.workspace.inputs import open_inputs
from vecmerge.workspace.names import Workspace


def _declare(folder, base):
    cfg = json.loads((folder / "adapter_config.json").read_text())
    cfg["base_model_name_or_path"] = base
    (folder / "adapter_config.json").write_text(json.dumps(cfg))


def test_inputs_are_opened_once_checked_before_reading_and_aligned(tmp_path, monkeypatch):
    """Each name is opened once (the workspace's adapter object), ``before_reading`` sees every adapter before
    any tensor is read, the vectors are the adapters' factors, and ``align`` gives the union of the modules
    with what each input lacks (c has one layer of a's two: 7 modules)."""
    monkeypatch.chdir(tmp_path)
    toy_adapter("a", shapes=llm_shapes(2, 32, 48, 4, 2, 8))
    toy_adapter("c", shapes=llm_shapes(1, 32, 48, 4, 2, 8), seed=2)
    ws = Workspace()
    read, seen = [], []
    real = Workspace.vector
    monkeypatch.setattr(Workspace, "vector", lambda self, name, *a: read.append(name) or real(self, name, *a))
    inputs = open_inputs(ws, ["a", "c", "a"], before_reading=lambda adapters: seen.append((list(adapters), len(read))))
    assert seen == [(["a", "c"], 0)] and read == ["a", "c"] and list(inputs.adapters) == ["a", "c"]
    assert inputs.adapters["a"] is ws.adapter("a")
    m = "model.layers.0.self_attn.q_proj"
    want = ws.adapter("a").factors(m)
    assert torch.equal(inputs.vectors["a"][m].B, want.B) and torch.equal(inputs.vectors["a"][m].A, want.A)
    with pytest.raises(AlignmentError, match="c lacks 7 module.*--allow-missing"):
        inputs.align()
    vecs, modules = inputs.align(allow_missing=True)
    assert len(vecs) == 2 and len(modules) == 14 and inputs.missing(modules)["a"] == []
    assert sorted(inputs.missing(modules)["c"]) == sorted(x for x in modules if x.startswith("model.layers.1."))
    (diff,), same = inputs.align([("a - c", parse("a - c"))], allow_missing=True)
    assert same == modules and torch.allclose(diff[m].dense(), want.dense() - ws.adapter("c").factors(m).dense(),
                                              rtol=1e-12, atol=1e-15)


def test_declared_base_models_are_checked_before_anything_is_read(tmp_path, monkeypatch):
    """Adapters declaring other base models are refused before ``before_reading`` runs, unless allowed; a
    relative declared folder is read from the workspace as well (``base`` and its absolute path agree)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "base").mkdir()
    for name, base in (("a", "base"), ("b", str(tmp_path / "base")), ("m", "org/other")):
        _declare(toy_adapter(name, shapes=llm_shapes(1, 32, 48, 4, 2, 8)), base)
    ws = Workspace()
    assert not open_inputs(ws, ["a", "b"]).base_models_differ
    called = []
    with pytest.raises(AlignmentError, match="different base models"):
        open_inputs(ws, ["a", "m"], before_reading=called.append)
    assert called == []
    allowed = open_inputs(ws, ["a", "m"], allow_base_mismatch=True)
    assert allowed.base_models_differ and allowed.declared == {"a": "base", "m": "org/other"}
