"""Typed results read as the JSON they print: fields typed, ``to_dict()`` in JSON order, a read-only mapping."""

from __future__ import annotations

import json
from dataclasses import FrozenInstanceError, dataclass
from pathlib import Path

import pytest

from vecmerge.analysis.audit import AuditReport, PairwiseReport, audit_pairwise, audit_trajectories
from vecmerge.analysis.inspect import AdapterSummary, describe
from vecmerge.outputs.manifest import jsonable
from vecmerge.report.format import to_json
from vecmerge.results import Result, json_field
from vecmerge.verify.report import VerifyReport, check, result
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


def test_verify_results_are_typed_and_keep_their_extra_keys():
    rows = [check("a", True, "fine"), check("b", True, "fine")]
    rep = result("out/x", rows, kind="output", dtype="fp32", tolerances={"update": 1e-6},
                 recipe={"base": "v54"}, not_independent="ties")
    assert isinstance(rep, VerifyReport) and rep.passed and rep.kind == "output" and rep.checks is rows
    assert list(rep) == ["target", "passed", "checks", "kind", "dtype", "tolerances", "recipe", "not_independent"]
    assert rep["not_independent"] == "ties" == rep.extra["not_independent"] and rep.get("adapters") is None
    assert result("t", rows).to_dict() == {"target": "t", "passed": True, "checks": rows}  # no kind: no key
    # a fuse kept each tensor's stored dtype: dtype prints as null beside its tolerances, not left out
    fused = result("f", rows, kind="fuse output", dtype=None, tolerances={"tensor_ulps": 1})
    assert list(fused) == ["target", "passed", "checks", "kind", "dtype", "tolerances"] and fused["dtype"] is None
    assert list(result("f", rows, kind="fuse output")) == ["target", "passed", "checks", "kind"]
    ids = result("v51; v54", rows, kind="identities", adapters=["/a", "/b"])
    assert list(ids) == ["target", "passed", "checks", "kind", "adapters"] and ids.adapters == ["/a", "/b"]
    again = VerifyReport(**{k: v for k, v in rep.to_dict().items() if k != "not_independent"},
                         extra={"not_independent": "ties"})
    assert to_json(again) == to_json(rep) == to_json(rep.to_dict())


def test_verify_output_returns_its_json(toy, run_cli):
    from vecmerge.verify.checks.output import verify_identities

    rep = verify_identities([Workspace().adapter(n, "drop") for n in ("v51", "v54")], labels=["v51", "v54"])
    assert isinstance(rep, VerifyReport) and rep.kind == "identities" and rep.passed == rep["passed"]
    res = run_cli("verify", "v51", "v54", "--identities", "--json")
    assert res.exit_code == 0 and res.output.strip() == to_json(rep.to_dict())


def test_extract_fuse_and_their_verify_are_typed_results_that_read_as_their_manifest(tmp_path):
    from finetune import make_pair

    from vecmerge.models.extract_write import ExtractReport, extract
    from vecmerge.models.fuse import FuseReport, fuse
    from vecmerge.verify.checks.output import verify_output

    base, tuned = make_pair(tmp_path / "pair", "qwen3")
    lora = extract(base, tuned, tmp_path / "lora", rank="2", others="drop")
    for made, kind, cls in ((lora, "extract", ExtractReport),
                            (fuse(tmp_path / "lora", base, tmp_path / "fused"), "fuse", FuseReport)):
        assert isinstance(made, cls) and made.kind == made["kind"] == kind and made.out == made["out"]
        written = json.loads((Path(made.out) / "vecmerge.json").read_text())
        assert list(made) == [*written, "out"] and json.loads(to_json(made)) == {**written, "out": made.out}
        assert to_json(cls(**made.to_dict())) == to_json(made)  # to_dict() round-trips
        rep = verify_output(made.out)
        assert isinstance(rep, VerifyReport) and rep.passed and rep.kind == f"{kind} output"
        assert list(rep)[:6] == ["target", "passed", "checks", "kind", "dtype", "tolerances"]
