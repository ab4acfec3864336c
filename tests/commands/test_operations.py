"""The command layer the CLI calls: JSON-ready results over a real ledger file."""

from __future__ import annotations

import csv
import io
import json

import pytest

from vecmerge.commands import operations as commands
from vecmerge.evidence import EvidenceError
from vecmerge.evidence.gate.gate import GateFacts, evaluate_gate
from vecmerge.evidence.gate.gate_facts import gate_evidence
from vecmerge.evidence.ledger.ledger import Ledger
from vecmerge.workspace.lineage import relation

OLD, NEW, SHA28, SHA54 = "a" * 64, "b" * 64, "c" * 64, "d" * 64
V51 = [1.0180, 0.9895, 1.0004, 1.0105, 1.0142]
M = "official_total"


@pytest.fixture
def ledger(tmp_path) -> Ledger:
    ledger = Ledger(tmp_path / "vecmerge-evidence.db")
    commands.add(ledger, "v51", V51, metric=M, sha256=NEW, higher_is_better=True)
    commands.add(ledger, "v28", [0.9836, 0.9890], metric=M, sha256=SHA28)
    commands.add(ledger, "v54", [0.9940, 0.9950, 0.9946], metric=M, sha256=SHA54)  # constructed runs
    commands.add(ledger, "v51", [0.90], metric=M, sha256=OLD, note="before retraining")
    return ledger


CURRENT = {"v51": NEW, "v28": SHA28, "v54": SHA54}


def test_add_returns_ids_and_direction(ledger):
    out = commands.add(ledger, "v59", [0.9944], metric=M, sha256=None, subs={"item": 0.2453})
    assert out["ids"] == [12] and out["direction"] is True and out["values"] == [0.9944]
    with pytest.raises(EvidenceError, match=r"--sub item has 1 value\(s\) for 2 run\(s\); give one per run"):
        commands.add(ledger, "v59", [0.99, 0.98], metric=M, sha256=None, subs={"item": 0.2})
    json.dumps(out)


def test_add_records_one_sub_score_per_run(ledger):
    """The multi-run form: --sub KEY=V1,V2,... gives run i the i-th value (v51's five runs, 0.2453 each)."""
    out = commands.add(ledger, "v51b", V51, metric=M, sha256=None, subs={"item": [0.2453] * 5, "video": V51[::-1]})
    runs = [r for r in ledger.records(["v51b"], M)]
    assert [r.value for r in runs] == V51 and [r.sub_scores for r in runs] == [
        {"item": 0.2453, "video": v} for v in V51[::-1]]
    assert out["subs"] == {"item": [0.2453] * 5, "video": V51[::-1]}
    with pytest.raises(EvidenceError, match=r"--sub item has 4 value\(s\) for 5 run\(s\)"):
        commands.add(ledger, "v51b", V51, metric=M, sha256=None, subs={"item": [0.2453] * 4})
    assert len(ledger.records(["v51b"], M)) == 5  # nothing half-written


def test_show_leaves_stale_records_out_and_counts_them(ledger):
    out = commands.show(ledger, ["v51"], M, current_sha=CURRENT)
    (summary,) = out["summaries"]
    assert summary["n"] == 5 and summary["mean"] == pytest.approx(sum(V51) / 5, rel=1e-14)
    assert out["stale"] == [{"model": "v51", "metric": M, "records": 1, "sha256s": [OLD]}]
    with_stale = commands.show(ledger, ["v51"], M, current_sha=CURRENT, include_stale=True)
    assert with_stale["summaries"][0]["n"] == 6
    json.dumps(out)
    with pytest.raises(EvidenceError, match="no records of v5l"):
        commands.show(ledger, ["v5l"])


def test_compare_and_export(ledger):
    out = commands.compare_models(ledger, "v51", "v28", current_sha=CURRENT)
    assert out["verdict"] == "v51 is better beyond eval noise" and out["welch"]["n"] == [5, 2]
    assert out["pooled"]["models"] == ["v51", "v28", "v54"]
    json.dumps(out)
    rows = list(csv.DictReader(io.StringIO(commands.export(ledger, "csv", current_sha=CURRENT))))
    assert len(rows) == 11 and sum(r["stale"] == "True" for r in rows) == 1
    data = json.loads(commands.export(ledger, "json"))
    assert data["directions"] == {M: True} and len(data["records"]) == 11
    with pytest.raises(EvidenceError, match="--format xml"):
        commands.export(ledger, "xml")


def test_ls_rows(ledger):
    entries = {"v51": {"path": "runs/v51", "sha256": NEW, "base_model": "B", "parent": "v28"},
               "v60": {"path": "runs/v60", "sha256": None, "base_model": "B", "parent": None}}
    rows = commands.ls_rows(entries, ledger, metric=M)
    assert rows[0]["sha256_short"] == NEW[:12] and rows[0]["runs"] == 5 and rows[0]["stale"] == 1
    assert rows[0]["mean"] == pytest.approx(sum(V51) / 5, rel=1e-14)
    assert rows[1]["runs"] == 0 and rows[1]["mean"] is None
    assert commands.ls_rows(entries, None)[0]["runs"] is None


def test_gate_evidence_feeds_the_gate(ledger):
    facts = GateFacts("v54", "v51", "v28", base_models={"v54": "B", "v51": "B", "v28": "B"}, shape_mismatches=[],
                      lineage=relation("v51", "v28", {"v51": "v28"}), consensus=(196, 196), trust=0.0113,
                      **gate_evidence(ledger, "v54", "v51", "v28", M, current_sha=CURRENT))
    assert facts.typical_noise.models == ("v51", "v28")  # the backbone's own runs are not its yardstick
    result = evaluate_gate(facts)
    assert result.passed, [(r.condition, r.status, r.detail) for r in result.rows]


def test_calibrate_needs_known_metrics(ledger):
    with pytest.raises(EvidenceError, match="metric 'local_cv'"):
        commands.calibrate_metrics(ledger, "local_cv", M)
    commands.add(ledger, "v28", [0.5], metric="local_cv", sha256=SHA28)
    out = commands.calibrate_metrics(ledger, "local_cv", M, current_sha=CURRENT)
    assert out["verdict"] == "too few models" and out["models"] == ["v28"]


def test_the_examples_walkthrough_figures(capsys):
    """examples/evidence/README.md quotes these verdicts and repeat counts; keep them true."""
    import runpy
    from pathlib import Path

    script = Path(__file__).parents[2] / "examples" / "evidence" / "walkthrough.py"
    out = runpy.run_path(str(script))["main"]()
    assert out[("v51", "v28")].verdict_code == "a_better" and out[("v51", "v28")].repeats_needed == 5
    assert out[("v59", "v58")].verdict_code == "not_enough_runs" and out[("v59", "v58")].repeats_needed == 4
    assert out[("v58", "v51")].verdict_code == "within_noise" and out[("v58", "v51")].repeats_needed == 8
    assert out[("v58", "v51")].welch.p == pytest.approx(0.0558, abs=5e-5)
    assert "pooled within-model noise: sd 0.0096 over v51, v28, v58 (7 df)" in capsys.readouterr().out


def test_plan_then_decide_over_the_runs_recorded_after_it(ledger):
    out = commands.plan(ledger, "v51", "v28", metric=M, min_effect=0.01, max_runs=6, current_sha=CURRENT)
    plan = out["plan"]
    assert (plan["a_sha256"], plan["b_sha256"], plan["after_record"]) == (NEW, SHA28, 11)  # the fixture's 11
    pooled = commands.compare_models(ledger, "v51", "v28", M, current_sha=CURRENT)["pooled"]["sd"]
    assert plan["noise_sd"] == pytest.approx(pooled, rel=1e-12) and plan["prior_scale"] == pytest.approx(0.01 / pooled)
    first = commands.decide(ledger, "v51", "v28", current_sha=CURRENT)
    assert first["decision"] == "continue" and first["runs"] == [0, 0] and "no look yet" in first["reason"]
    for i in range(4):  # the earlier runs are not looks: only these are
        commands.add(ledger, "v51", [1.03 + 0.001 * i], metric=M, sha256=NEW)
        commands.add(ledger, "v28", [0.98 - 0.001 * i], metric=M, sha256=SHA28)
    commands.add(ledger, "v51", [1.5], metric=M, sha256=OLD)  # other weights: not the plan's
    out = commands.decide(ledger, "v51", "v28", M, current_sha=CURRENT, replay=True)
    assert out["decision"] == "stop_better" and out["runs"] == [4, 4] and len(out["looks"]) == 5
    assert [x["decision"] for x in out["looks"]] == ["continue"] * 4 + ["stop_better"]
    assert "looks" not in commands.decide(ledger, "v51", "v28", current_sha=CURRENT)
    json.dumps(out)
    evidence = gate_evidence(ledger, "v54", "v51", "v28", M, current_sha=CURRENT)
    assert evidence["plan"].id == plan["id"] and evidence["plan_decision"].decision == "stop_better"


def test_plans_are_refused_or_looked_up_clearly(ledger):
    with pytest.raises(EvidenceError, match="no plan of v51 --vs v28 in .*evidence plan v51 --vs v28"):
        commands.decide(ledger, "v51", "v28")
    commands.add(ledger, "v51", [0.5], metric="loss", sha256=NEW)
    with pytest.raises(EvidenceError, match="loss: no direction recorded; declare it first"):
        commands.plan(ledger, "v51", "v28", metric="loss", min_effect=0.01, max_runs=5)
    commands.plan(ledger, "v51", "v28", metric=M, min_effect=0.01, max_runs=5, current_sha=CURRENT)
    with pytest.raises(EvidenceError, match="v51 now has other weights .* record a new plan"):
        commands.decide(ledger, "v51", "v28", current_sha={**CURRENT, "v51": OLD})


def test_compare_reports_every_sub_score_keyed_by_name(ledger):
    commands.add(ledger, "x", [1.0, 1.01, 0.99], metric="tot", sha256=None, higher_is_better=True,
                 subs={"video": [0.31, 0.32, 0.30], "item": [0.2453] * 3})
    commands.add(ledger, "y", [0.97, 0.98, 0.99], metric="tot", sha256=None,
                 subs={"video": [0.28, 0.29, 0.27], "item": [0.2453] * 3})
    out = commands.compare_models(ledger, "x", "y", "tot", target="video")
    subs = out["subscores"]
    assert set(subs["subscores"]) == {"item", "video"} and subs["target"] == "video"
    assert subs["subscores"]["item"]["kind"] == "exact" and subs["cost"]["not_worse"] == ["item"]
    assert subs["subscores"]["video"]["test"]["kind"] == "welch"
    with pytest.raises(EvidenceError, match="--target world: x and y recorded no such sub-score of tot; known: item"):
        commands.compare_models(ledger, "x", "y", "tot", target="world")
    json.dumps(out)


def test_show_reports_the_grid_of_the_published_grades(tmp_path):
    """examples/evidence/grades.csv: the six published grades of the item sub-score (懂物料), v51's five runs."""
    from pathlib import Path

    ledger = Ledger(tmp_path / "l.db")
    commands.import_(ledger, [Path(__file__).parents[2] / "examples" / "evidence" / "grades.csv"])
    (grid,) = commands.show(ledger)["grids"]
    assert grid["metric"] == "item_understanding" and grid["sub"] is None and grid["multiples"]
    assert 0.0306 <= grid["step"] <= 0.0307 and grid["grades"] == [0, 1, 2, 3, 4, 5]
