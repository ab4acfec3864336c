"""Typed results read as the JSON they print: fields typed, ``to_dict()`` in JSON order, a read-only mapping."""

from __future__ import annotations

import json
from dataclasses import FrozenInstanceError, dataclass

import pytest

from vecmerge.analysis.audit import AuditReport, PairwiseReport, audit_pairwise, audit_trajectories
from vecmerge.analysis.inspect import AdapterSummary, describe
from vecmerge.outputs.manifest import jsonable
from vecmerge.results import Result, json_field
from vecmerge.workspace.names import Workspace


@dataclass(frozen=True, eq=False)
class Toy(Result):
    a: int
    b_: str = json_field("b")
    c: float | None = json_field(optional=True, default=None)


def test_a_result_is_its_json_mapping_frozen_and_typed():
    t = Toy(1, "x")
    assert t.to_dict() == {"a": 1, "b": "x"} and list(t) == ["a", "b"] and len(t) == 2
    assert t["b"] == "x" and t.get("c") is None and dict(t) == {"a": 1, "b": "x"}
    assert Toy(1, "x", 2.0).to_dict() == {"a": 1, "b": "x", "c": 2.0}
    assert t == {"a": 1, "b": "x"}  # compares as the mapping it prints
    with pytest.raises(FrozenInstanceError):
        t.a = 2
    with pytest.raises(TypeError):
        t["a"] = 2  # read-only
    assert jsonable({"nested": [t]}) == {"nested": [{"a": 1, "b": "x"}]}


def test_inspect_and_audit_return_typed_results_whose_json_is_what_they_print(toy, run_cli):
    ws = Workspace()
    info = describe(ws.adapter("v54", "drop"))
    assert isinstance(info, AdapterSummary) and info.modules == info["modules"] > 0
    res = run_cli("inspect", "v54", "--json")
    assert res.exit_code == 0 and json.loads(res.output) == jsonable(info.to_dict())

    rep = audit_trajectories(ws, "v54 - v54e2", "v51 - v28", samples=0)
    assert isinstance(rep, AuditReport) and rep.direction == rep["dir"] == "v51 - v28"
    assert list(rep)[:3] == ["kind", "ref", "dir"] and rep.kind == "audit"
    out = run_cli("audit", "--ref", "v54 - v54e2", "--dir", "v51 - v28", "--samples", "0", "--format", "json")
    printed = json.loads(out.output)  # the report adds the view it rendered
    assert out.exit_code == 0 and {k: printed[k] for k in rep} == jsonable(rep.to_dict()) and printed["view"]

    pw = audit_pairwise(ws, ["v28", "v51", "v54"])
    assert isinstance(pw, PairwiseReport) and pw.kind == "pairwise" and len(pw.pairs) == 3
    assert list(pw) == ["kind", "missing", "pairwise", "pairs", "base_models", "base_models_differ"]
