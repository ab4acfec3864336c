"""The six-condition gate on constructed facts: each condition flips between PASS and FAIL (or UNKNOWN)."""

from __future__ import annotations

import dataclasses

import pytest
from scipy import stats

from vecmerge.evidence import EvidenceError
from vecmerge.evidence.gate.gate import (
    CONDITIONS,
    FAIL,
    PASS,
    UNKNOWN,
    GateConfig,
    GateConfigError,
    GateFacts,
    evaluate_gate,
)
from vecmerge.evidence.judge.compare import compare_records
from vecmerge.evidence.judge.subscores import compare_subscores
from vecmerge.evidence.ledger.ledger import Record
from vecmerge.evidence.stats.noise import pooled_noise
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
        comparison=comparison(), consensus=(196, 196), consensus_ref="v54 - v54e2", trust=0.0113,
        subscores=compare_subscores("v51", "v28", recs("v51", V51, 0) + recs("v28", V28, 100), higher_is_better=True))
    return dataclasses.replace(facts, **changes)


def status(facts, condition, config=None):
    return evaluate_gate(facts, config).row(condition).status


def test_the_v58_facts_pass_every_condition():
    result = evaluate_gate(v58_facts())
    assert [r.condition for r in result.rows] == list(CONDITIONS)
    assert [r.status for r in result.rows] == [PASS] * 7 and result.passed and result.exit_code == 0
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


def test_stable_backbone_of_one_run_allowed_by_min_repeats_1_is_unknown_not_a_crash():
    row = evaluate_gate(v58_facts(backbone_runs=V54[:1]), GateConfig.from_dict({"min_repeats": 1})).row(
        "stable backbone")
    assert row.status == UNKNOWN and "1 run, so its spread cannot be measured" in row.detail


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
    assert [r.status for r in result.rows].count(PASS) == 6


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


# -- the seventh condition: no sub-score regresses ----------------------------------------------------------
Y_VIDEO = [0.3012, 0.2874, 0.2951, 0.3103, 0.2987]  # constructed: v28's video sub-score over five runs


def sub_recs(model, values, start, key="video", extra=None):
    return [Record(start + i, model, None, "official_total", 1.0, tuple(sorted({key: v, **(extra or {})}.items())))
            for i, v in enumerate(values)]


def protected(x_values, y_values=Y_VIDEO, config=None, extra_x=None, extra_y=None, keys=None):
    c = GateConfig.from_dict(config or {"margin": 0.01})
    subs = compare_subscores("v51", "v28", sub_recs("v51", x_values, 0, extra=extra_x)
                             + sub_recs("v28", y_values, 100, extra=extra_y), higher_is_better=True,
                             keys=keys, margins=c.margin, margin_source=c.source_of("margin"))
    return evaluate_gate(v58_facts(subscores=subs), c).row("no sub-score regresses")


@pytest.mark.parametrize("shift, runs, expected", [
    (+0.02, 5, PASS),     # better: shown not worse by 0.01
    (-0.002, 5, UNKNOWN),  # a little lower, noise 0.009: neither shown not worse nor worse
    (-0.05, 5, FAIL),     # far lower: worse beyond noise
    (-0.02, 2, UNKNOWN),  # lower, two runs: undecided, with the runs that would decide
])
def test_the_non_inferiority_boundary_flips_pass_unknown_fail(shift, runs, expected):
    x = [v + shift for v in Y_VIDEO][:runs]
    row = protected(x)
    assert row.status == expected, row.detail
    if expected == UNKNOWN:
        assert "undecided" in row.detail and "more run(s) each" in row.detail
    if expected == FAIL:
        assert row.detail.startswith("video worse (-0.05")
    assert row.threshold.startswith("protect all recorded: each not worse than v28 by its margin (0.01")
    assert row.source == "protect default; margin vecmerge.yaml gate.margin"


def test_fail_when_the_whole_interval_lies_below_minus_the_margin():
    """video 0.014 lower: p 0.0297, Holm with goods (p far larger) 0.059: not worse beyond noise; but its 95%
    interval [-0.0262, -0.00177] (scipy's Welch interval) lies below -0.001: FAIL, named."""
    x = [v - 0.014 for v in Y_VIDEO]
    goods_x, goods_y = [0.1004, 0.1102, 0.1051, 0.0983, 0.1027], [0.1031, 0.0994, 0.1085, 0.1006, 0.1042]
    recs = [Record(i, "v51", None, "official_total", 1.0, (("goods", gx), ("video", v)))
            for i, (gx, v) in enumerate(zip(goods_x, x))]
    recs += [Record(100 + i, "v28", None, "official_total", 1.0, (("goods", gy), ("video", v)))
             for i, (gy, v) in enumerate(zip(goods_y, Y_VIDEO))]
    subs = compare_subscores("v51", "v28", recs, higher_is_better=True, margins=0.001)
    video = subs.row("video")
    ref = stats.ttest_ind(x, Y_VIDEO, equal_var=False)
    assert video.p_holm == pytest.approx(2 * ref.pvalue, rel=1e-10) and video.p_holm > 0.05
    assert video.test.ci_high == pytest.approx(ref.confidence_interval().high, rel=1e-10)
    assert video.test.ci_high < -0.001
    row = evaluate_gate(v58_facts(subscores=subs)).row("no sub-score regresses")
    assert row.status == FAIL and "video worse" in row.detail and "whole interval lies below -0.001" in row.detail


def test_zero_variance_sub_scores_are_decided():
    same = protected(Y_VIDEO, extra_x={"item": 0.2453}, extra_y={"item": 0.2453}, keys=["item"])
    assert same.status == PASS and same.detail == "1 sub-score(s) not worse than v28: item"
    lower = protected(Y_VIDEO, extra_x={"item": 0.2146}, extra_y={"item": 0.2453}, keys=["item"])
    assert lower.status == FAIL and lower.detail.startswith("item worse (-0.0307")


def test_protect_names_and_nothing_recorded():
    row = protected(Y_VIDEO, keys=["video", "world"], config={"protect": ["video", "world"], "margin": 0.01})
    assert row.status == UNKNOWN and "world (runs of world: v51 0, v28 0" in row.detail
    empty = compare_subscores("v51", "v28", recs("v51", V51, 0) + recs("v28", V28, 100), higher_is_better=True)
    row = evaluate_gate(v58_facts(subscores=empty)).row("no sub-score regresses")
    assert row.status == PASS and "none to protect" in row.detail
    assert status(v58_facts(subscores=None), "no sub-score regresses") == UNKNOWN
    with pytest.raises(EvidenceError, match="sub-score comparison is v28 vs v51"):
        evaluate_gate(v58_facts(subscores=compare_subscores("v28", "v51", [], higher_is_better=True)))


def test_protect_and_margin_are_checked_with_the_other_keys():
    config = GateConfig.from_dict({"protect": ["video", "item"], "margin": {"video": 0.01, "item": 0.0307}})
    assert config.protect == ("video", "item") and config.margin == {"video": 0.01, "item": 0.0307}
    assert GateConfig.from_dict({"protect": "all", "margin": 0.02}).margin == 0.02
    with pytest.raises(GateConfigError) as info:
        GateConfig.from_dict({"protect": "video", "margin": {"video": -1}})
    assert "protect='video': all, or a list" in str(info.value) and "margin={'video': -1}" in str(info.value)
    with pytest.raises(GateConfigError, match="margin=0"):
        GateConfig.from_dict({"margin": 0})


def test_a_plan_decides_the_repeated_evidence_row():
    from vecmerge.evidence.ledger.ledger import Plan
    from vecmerge.evidence.stats.sequential import decide_runs

    plan = Plan(3, "v51", "v28", "official_total", None, None, 0.01, 10, 0.05, True, 0.0096, 1.04, "t-mixture",
                12, "2026-01-01T00:00:00Z")
    runs = [("v51", v) for v in V51] + [("v28", v) for v in V28]
    going = decide_runs(runs, a="v51", b="v28", min_effect=0.01, max_runs=10, prior_scale=1.04)
    row = evaluate_gate(v58_facts(plan=plan, plan_decision=going)).row("repeated evidence")
    assert going.decision == "continue" and row.status == UNKNOWN
    assert row.source == "evidence plan 3 (2026-01-01T00:00:00Z)"
    assert row.detail.startswith("continue after 5 + 2 planned runs") and row.numbers["plan"]["id"] == 3
    better = decide_runs([("v51", 1.02 + 0.001 * i) for i in range(6)] + [("v28", 0.98 - 0.001 * i) for i in range(6)],
                         a="v51", b="v28", min_effect=0.01, max_runs=10)
    assert better.decision == "stop_better"
    assert status(v58_facts(plan=plan, plan_decision=better), "repeated evidence") == PASS
    futile = decide_runs([("v51", 0.98), ("v28", 0.98)] * 10, a="v51", b="v28", min_effect=0.01, max_runs=10)
    assert futile.decision == "stop_futile"
    assert status(v58_facts(plan=plan, plan_decision=futile), "repeated evidence") == FAIL
