"""The six-condition gate on constructed facts: each condition flips between PASS and FAIL (or UNKNOWN)."""

from __future__ import annotations

import dataclasses

import pytest

from vecmerge.evidence import EvidenceError
from vecmerge.evidence.compare import compare_records
from vecmerge.evidence.gate import (
    CONDITIONS,
    FAIL,
    PASS,
    UNKNOWN,
    GateConfig,
    GateConfigError,
    GateFacts,
    evaluate_gate,
)
from vecmerge.evidence.ledger import Record
from vecmerge.evidence.noise import pooled_noise
from vecmerge.workspace.lineage import relation

V51 = [1.0180, 0.9895, 1.0004, 1.0105, 1.0142]
V28 = [0.9836, 0.9890]
V54 = [0.9940, 0.9950, 0.9946]  # CONSTRUCTED: the user published only v54's mean of three runs (0.99453)
BASE = "OneReason-0.8B"
PARENTS = {"v51": "v28", "v28": "v16", "v54": "v16", "v16": None}


def recs(model, values, start):
    return [Record(start + i, model, None, "official_total", v) for i, v in enumerate(values)]


def comparison(x_runs=V51, y_runs=V28, **kw):
    return compare_records("v51", "v28", recs("v51", x_runs, 0) + recs("v28", y_runs, 100),
                           **{"higher_is_better": True, **kw})


def v58_facts(**changes) -> GateFacts:
    """The user's v58: v54 + 0.1226 (v51 - v28), with every condition true."""
    facts = GateFacts(
        backbone="v54", x="v51", y="v28",
        base_models={"v54": BASE, "v51": BASE, "v28": BASE}, shape_mismatches=[],
        lineage=relation("v51", "v28", PARENTS), closeness={"cosine(v51, v28)": 0.97},
        backbone_runs=V54, typical_noise=pooled_noise({"v51": V51, "v28": V28}),
        comparison=comparison(), consensus=(196, 196), consensus_ref="v54 - v54e2", trust=0.0113)
    return dataclasses.replace(facts, **changes)


def status(facts, condition, config=None):
    return evaluate_gate(facts, config).row(condition).status


def test_the_v58_facts_pass_every_condition():
    result = evaluate_gate(v58_facts())
    assert [r.condition for r in result.rows] == list(CONDITIONS)
    assert [r.status for r in result.rows] == [PASS] * 6 and result.passed and result.exit_code == 0
    rows = {r.condition: r for r in result.rows}
    assert rows["module consensus"].detail == "196/196 modules agree against v54 - v54e2 (100.0%)"
    assert rows["small trust region"].threshold == "trust <= 0.015" and rows["small trust region"].source == "default"
    assert rows["common parent"].detail == "v51 descends from v28 (1 generation)"
    assert rows["repeated evidence"].detail.startswith("v51 is better beyond eval noise on official_total (welch)")
    assert rows["stable backbone"].numbers["limit"] == pytest.approx(0.0104721, abs=1e-7)
    assert result.to_dict()["passed"] is True


@pytest.mark.parametrize("changes, expected", [
    ({"base_models": {"v54": BASE, "v51": BASE, "v28": "Qwen3-1.7B"}}, FAIL),
    ({"base_models": {"v54": BASE, "v51": None, "v28": BASE}}, UNKNOWN),
    ({"base_models": {"v54": BASE, "v51": BASE}}, UNKNOWN),  # v28 declares nothing
    ({"shape_mismatches": ["layers.0.q_proj: 32x32 vs 32x48"]}, FAIL),
    ({"shape_mismatches": None}, UNKNOWN),
])
def test_common_base(changes, expected):
    assert status(v58_facts(**changes), "common base") == expected


@pytest.mark.parametrize("changes, expected", [
    ({"lineage": None}, UNKNOWN),
    ({"lineage": relation("v51", "v28", {"v51": None, "v28": None}, roots={"v51", "v28"})}, FAIL),
    ({"lineage": relation("v51", "v28", {})}, UNKNOWN),
    ({"lineage": relation("v51", "v28", {"v51": "v16", "v28": "v16"})}, PASS),  # siblings
])
def test_common_parent(changes, expected):
    assert status(v58_facts(**changes), "common parent") == expected


def test_common_parent_must_be_about_x_and_y():
    with pytest.raises(EvidenceError, match="lineage is of v54 and v28"):
        evaluate_gate(v58_facts(lineage=relation("v54", "v28", PARENTS)))


@pytest.mark.parametrize("changes, expected", [
    ({"backbone_runs": V54[:2]}, FAIL),  # fewer than min_repeats = 3
    ({"backbone_runs": ()}, UNKNOWN),
    ({"backbone_runs": [0.96, 0.99453, 1.03]}, FAIL),  # std 0.035 > pooled noise 0.0105
    ({"typical_noise": None}, UNKNOWN),  # nothing to compare the spread with
])
def test_stable_backbone(changes, expected):
    assert status(v58_facts(**changes), "stable backbone") == expected


def test_stable_backbone_with_a_set_limit_names_its_source():
    config = GateConfig.from_dict({"max_backbone_sd": 0.0001, "min_repeats": 2})
    row = evaluate_gate(v58_facts(typical_noise=None), config).row("stable backbone")
    assert row.status == FAIL and row.threshold == ">= 2 runs, std <= 0.0001"
    assert row.source == "min_repeats vecmerge.yaml gate.min_repeats; vecmerge.yaml gate.max_backbone_sd"
    assert status(v58_facts(typical_noise=None), "stable backbone", GateConfig.from_dict({"max_backbone_sd": 0.01})) \
        == PASS


@pytest.mark.parametrize("comparison_kw, code, expected", [
    (None, None, UNKNOWN),
    ({"x_runs": [0.95, 0.96, 0.955]}, "b_better", FAIL),  # v28 better: the direction is wrong
    ({"x_runs": [0.99, 0.98, 0.9850]}, "within_noise", FAIL),
    ({"y_runs": [0.9836]}, "not_enough_runs", UNKNOWN),  # v28 ran once
    ({"higher_is_better": None}, "a_higher", UNKNOWN),  # no direction recorded for the metric
])
def test_repeated_evidence(comparison_kw, code, expected):
    cmp = None if comparison_kw is None else comparison(**comparison_kw)
    assert cmp is None or cmp.verdict_code == code
    assert status(v58_facts(comparison=cmp), "repeated evidence") == expected


def test_repeated_evidence_respects_min_evidence_runs_and_checks_its_inputs():
    assert status(v58_facts(), "repeated evidence", GateConfig.from_dict({"min_evidence_runs": 3})) == UNKNOWN
    with pytest.raises(EvidenceError, match="comparison is v28 vs v51"):
        evaluate_gate(v58_facts(comparison=compare_records("v28", "v51", recs("v51", V51, 0) + recs("v28", V28, 9))))
    with pytest.raises(EvidenceError, match="confidence 0.9, the gate 0.95"):
        evaluate_gate(v58_facts(comparison=comparison(confidence=0.9)))


@pytest.mark.parametrize("consensus, config, expected", [
    ((195, 196), None, FAIL),
    ((195, 196), {"min_agree": 0.95}, PASS),
    (None, None, UNKNOWN),
    ((0, 0), None, UNKNOWN),
])
def test_module_consensus(consensus, config, expected):
    assert status(v58_facts(consensus=consensus), "module consensus", GateConfig.from_dict(config)) == expected


@pytest.mark.parametrize("trust, expected", [(0.0113, PASS), (0.0113 * 1.456, FAIL), (None, UNKNOWN)])
def test_small_trust_region(trust, expected):
    """v58's 1.13% passes; v59 took the same direction 45.6% further (about 1.65%) and fails the default."""
    assert status(v58_facts(trust=trust), "small trust region") == expected


def test_unknown_is_not_a_pass():
    result = evaluate_gate(v58_facts(trust=None))
    assert not result.passed and result.exit_code == 1
    assert [r.status for r in result.rows].count(PASS) == 5


def test_config_reports_every_problem_at_once():
    with pytest.raises(GateConfigError) as info:
        GateConfig.from_dict({"min_repeats": 0, "max_trust": -1, "min_agree": 1.5, "confidense": 0.9,
                              "max_backbone_sd": "small", "min_evidence_runs": True, "confidence": float("nan")})
    msg = str(info.value)
    assert msg.startswith("vecmerge.yaml gate: 7 problems: confidense: unknown key") and "\n" not in msg
    for part in ("min_repeats=0: an integer >= 1", "max_trust=-1", "min_agree=1.5", "max_backbone_sd='small'",
                 "min_evidence_runs=True", "confidence=nan"):
        assert part in msg, part
    with pytest.raises(GateConfigError, match="expected a mapping"):
        GateConfig.from_dict([1, 2])
    assert GateConfig.from_dict(None) == GateConfig()


def test_config_values_and_sources():
    c = GateConfig.from_dict({"max_trust": 0.02, "metric": "official_total", "max_backbone_sd": None},
                             source="ws/vecmerge.yaml")
    assert (c.max_trust, c.metric, c.min_repeats) == (0.02, "official_total", 3)
    assert c.source_of("max_trust") == "ws/vecmerge.yaml gate.max_trust" and c.source_of("min_agree") == "default"
    row = evaluate_gate(v58_facts(trust=0.018), c).row("small trust region")
    assert (row.status, row.source) == (PASS, "ws/vecmerge.yaml gate.max_trust")
