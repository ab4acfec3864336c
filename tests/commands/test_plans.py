"""`evidence plan` / `decide` / `plan_status` over a real ledger (and the shared toy ledger, v51 vs v28): issue 33's
findings as regression tests, and issue 36's mutant (runs of other weights under the plan's names, recorded during
the plan, are not looks)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from toy_ledger import CURRENT as TOY_CURRENT
from toy_ledger import SHA28, toy_ledger

from vecmerge.commands import plans as commands
from vecmerge.commands.judging import compare_models
from vecmerge.commands.recording import add
from vecmerge.evidence import EvidenceError
from vecmerge.evidence.gate.gate_facts import gate_evidence
from vecmerge.evidence.ledger.ledger import Ledger
from vecmerge.evidence.stats.plan_power import fixed_n_power
from vecmerge.evidence.stats.planned import decide_planned

OLD, NEW, SHA54 = "a" * 64, "b" * 64, "d" * 64
M = "official_total"
V54 = [0.9940, 0.9950, 0.9946]
CURRENT = {"v58": NEW, "v54": SHA54}


@pytest.fixture
def ledger(tmp_path) -> Ledger:
    ledger = Ledger(tmp_path / "vecmerge-evidence.db")
    add(ledger, "v54", V54, metric=M, sha256=SHA54, higher_is_better=True)
    add(ledger, "v58", [1.0202, 1.0230], metric=M, sha256=NEW)
    add(ledger, "v58", [0.95], metric=M, sha256=OLD, note="other weights under the same name")
    return ledger


def test_plan_warns_at_five_runs_and_names_the_runs_that_reach_80_percent(ledger):
    """Issue 33: nothing warned that a 5-run plan cannot decide D = 0.01 at sd 0.012. The stated power is
    checked against 1000 plans run through decide_planned itself (4 se), the fixed-n runs against the noncentral
    t (scipy), and the 80% runs by 400 plans at that N (>= 0.8 - 3 se)."""
    out = commands.plan(ledger, "v58", "v54", metric=M, min_effect=0.01, max_runs=5, current_sha=CURRENT,
                        noise_sd=0.012)
    power = out["power"]
    assert power["power_d"] < 0.5 and power["warning"].startswith("power 1")
    assert f"about {power['n_for_80']} runs of each reach 80%" in power["warning"]
    assert out["plan"]["design"]["power"] == power and out["plan"]["design"]["sd_from"] == "--noise-sd"
    rng = np.random.default_rng(11)

    def rate(n, sims, delta=0.01):
        xa, xb = rng.normal(delta, 0.012, (sims, n)), rng.normal(0.0, 0.012, (sims, n))
        return np.mean([decide_planned([r for p in zip((("A", x) for x in a), (("B", y) for y in b)) for r in p],
                                       min_effect=0.01, max_runs=n).decision == "stop_better" for a, b in zip(xa, xb)])

    se = np.sqrt(power["power_d"] * (1 - power["power_d"]) / 1000)
    assert abs(rate(5, 1000) - power["power_d"]) < 4 * se
    n = power["fixed_n"]
    assert fixed_n_power(n, 0.01 / 0.012, 0.05) >= power["power_d"] > fixed_n_power(n - 1, 0.01 / 0.012, 0.05)
    assert rate(power["n_for_80"], 400) >= 0.8 - 3 * np.sqrt(0.16 / 400)
    json.dumps(out)


def test_runs_before_the_plan_count_as_its_first_look_with_use_existing(ledger):
    """Issue 33: v54's three runs counted for nothing. With --use-existing they (and v58's two of these weights,
    not the one of other weights) are the first look, recorded in the plan."""
    out = commands.plan(ledger, "v58", "v54", metric=M, min_effect=0.01, max_runs=6, current_sha=CURRENT,
                        use_existing=True)
    assert out["plan"]["design"]["existing"] == [2, 3]
    status = commands.plan_status(ledger, ledger.plans()[-1], current_sha=CURRENT)
    assert status.looks_used == 1 and status.runs == (2, 3) and status.decision.looks[0].record_id == 5
    assert status.power == out["power"]
    plain = commands.plan(ledger, "v58", "v54", metric=M, min_effect=0.01, max_runs=6, current_sha=CURRENT)
    assert plain["plan"]["design"]["existing"] is None
    assert commands.decide(ledger, "v58", "v54", current_sha=CURRENT)["runs"] == [0, 0]  # the latest plan
    with pytest.raises(EvidenceError, match="--use-existing: v54 already has 3 runs .* raise --max-runs to at least 3"):
        commands.plan(ledger, "v58", "v54", metric=M, min_effect=0.01, max_runs=2, current_sha=CURRENT,
                      use_existing=True)


def test_the_direction_may_be_given_on_the_plan(ledger):
    """Issue 33: plan refused until some run declared the metric's direction."""
    out = commands.plan(ledger, "v58", "v54", metric="loss", min_effect=0.01, max_runs=5, current_sha=CURRENT,
                        higher_is_better=False)
    assert out["plan"]["higher_is_better"] is False and ledger.direction("loss") is False
    with pytest.raises(EvidenceError, match="loss: the ledger records lower is better; the plan says higher"):
        commands.plan(ledger, "v58", "v54", metric="loss", min_effect=0.01, max_runs=5, higher_is_better=True)
    with pytest.raises(EvidenceError, match="acc: no direction recorded; give it on the plan"):
        commands.plan(ledger, "v58", "v54", metric="acc", min_effect=0.01, max_runs=5)
    assert ledger.direction("acc") is None and len(ledger.plans()) == 1


def test_runs_of_other_weights_recorded_during_the_plan_are_not_looks(ledger):
    """Issue 36's mutant: runs of v58 with another sha256, recorded between the plan's own runs, must not be
    counted; the decision equals the one over the plan's runs alone (decide_planned on them by hand)."""
    commands.plan(ledger, "v58", "v54", metric=M, min_effect=0.01, max_runs=4, current_sha=CURRENT)
    own = [("v58", 1.021), ("v54", 0.994), ("v58", 1.024), ("v54", 0.996), ("v58", 1.022), ("v54", 0.995)]
    for i, (model, value) in enumerate(own):
        add(ledger, model, [value], metric=M, sha256=NEW if model == "v58" else SHA54)
        if i % 2 == 0:  # during the plan, before it stops: a high score of other weights under the same name
            add(ledger, "v58", [2.0], metric=M, sha256=OLD)
    out = commands.decide(ledger, "v58", "v54", current_sha=CURRENT, replay=True)
    want = decide_planned(own, a="v58", b="v54", min_effect=0.01, max_runs=4)
    assert out["runs"] == list(want.runs) and [x["n_a"] for x in out["looks"]] == [x.n_a for x in want.looks]
    assert out["after_stop"] == want.after_stop and out["beyond_max"] == 0  # the other weights' runs: not even that
    assert out["decision"] == want.decision and out["last"]["diff"] == pytest.approx(want.last.diff, rel=1e-12)
    old_ids = {r.id for r in ledger.records(["v58"], M, include_stale=True) if r.sha256 == OLD}
    assert not old_ids & {x["record_id"] for x in out["looks"]}


def test_plan_status_is_the_typed_state_a_report_reads(ledger):
    commands.plan(ledger, "v58", "v54", metric=M, min_effect=0.01, max_runs=3, current_sha=CURRENT, noise_sd=0.012)
    add(ledger, "v58", [1.02, 1.03], metric=M, sha256=NEW)
    add(ledger, "v54", [0.99, 0.995], metric=M, sha256=SHA54)
    status = commands.plan_status(ledger, ledger.plans()[-1], current_sha=CURRENT)
    assert isinstance(status, commands.PlanStatus) and status.runs == (2, 2) and status.looks_used == 1
    assert status.decision.decision in ("continue", "stop_better") and 0 < status.power["power_d"] < 1
    assert status.to_dict()["looks_used"] == 1 and "looks" in status.to_dict(replay=True)


@pytest.fixture
def toy(tmp_path) -> Ledger:
    """The shared toy ledger (``toy_ledger``): v51 against v28."""
    return toy_ledger(tmp_path / "toy.db")


def test_plan_then_decide_over_the_runs_recorded_after_it(toy):
    out = commands.plan(toy, "v51", "v28", metric=M, min_effect=0.01, max_runs=6, current_sha=TOY_CURRENT,
                        kind="t-mixture")
    plan = out["plan"]
    assert (plan["a_sha256"], plan["b_sha256"], plan["after_record"]) == (NEW, SHA28, 11)  # the fixture's 11
    pooled = compare_models(toy, "v51", "v28", M, current_sha=TOY_CURRENT)["pooled"]["sd"]
    assert plan["noise_sd"] == pytest.approx(pooled, rel=1e-12) and plan["prior_scale"] == pytest.approx(0.01 / pooled)
    first = commands.decide(toy, "v51", "v28", current_sha=TOY_CURRENT)
    assert first["decision"] == "continue" and first["runs"] == [0, 0] and "no look yet" in first["reason"]
    for i in range(4):  # the earlier runs are not looks: only these are
        add(toy, "v51", [1.03 + 0.001 * i], metric=M, sha256=NEW)
        add(toy, "v28", [0.98 - 0.001 * i], metric=M, sha256=SHA28)
    add(toy, "v51", [1.5], metric=M, sha256=OLD)  # other weights: not the plan's
    out = commands.decide(toy, "v51", "v28", M, current_sha=TOY_CURRENT, replay=True)
    assert out["decision"] == "stop_better" and out["runs"] == [4, 4] and len(out["looks"]) == 5
    assert [x["decision"] for x in out["looks"]] == ["continue"] * 4 + ["stop_better"]
    assert "looks" not in commands.decide(toy, "v51", "v28", current_sha=TOY_CURRENT)
    json.dumps(out)
    evidence = gate_evidence(toy, "v54", "v51", "v28", M, current_sha=TOY_CURRENT)
    assert evidence["plan"].id == plan["id"] and evidence["plan_decision"].decision == "stop_better"


def test_plans_are_refused_or_looked_up_clearly(toy):
    with pytest.raises(EvidenceError, match="no plan of v51 --vs v28 in .*evidence plan v51 --vs v28"):
        commands.decide(toy, "v51", "v28")
    add(toy, "v51", [0.5], metric="loss", sha256=NEW)
    with pytest.raises(EvidenceError, match="loss: no direction recorded; give it on the plan"):
        commands.plan(toy, "v51", "v28", metric="loss", min_effect=0.01, max_runs=5)
    commands.plan(toy, "v51", "v28", metric=M, min_effect=0.01, max_runs=5, current_sha=TOY_CURRENT)
    with pytest.raises(EvidenceError, match="v51 now has other weights .* record a new plan"):
        commands.decide(toy, "v51", "v28", current_sha={**TOY_CURRENT, "v51": OLD})
