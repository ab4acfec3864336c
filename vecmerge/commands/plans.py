"""``vecmerge evidence plan`` records a pre-registered plan with its power; ``evidence decide`` judges its looks.

``check_plan_weights`` and ``plan_looks`` live in ``evidence.stats.sequential``, shared with the gate
(``evidence.gate.gate_facts``): a plan holds only for the weights it names, and its looks are read in one eval
environment. The ledger operations (``plan``, ``decide``, ``plan_status``) return JSON-ready data; the
commands take the workspace and the request, and print the report.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import UsageError
from ..evidence import EvidenceError
from ..evidence.ledger.environment import EnvChoice, environments
from ..evidence.ledger.ledger import Ledger, Plan
from ..evidence.ledger.records import PLAN_TESTS
from ..evidence.stats.noise import pooled_noise
from ..evidence.stats.plan_power import anytime_power, plan_power
from ..evidence.stats.planned import TEST, Design, decide_plan
from ..evidence.stats.sequential import SequentialDecision, check_plan_weights, plan_looks
from ..evidence.stats.stats import runs_by_model
from ..report import plans as report_plans
from ..requests import EvidenceDecide, EvidencePlan
from ..workspace.names import Workspace
from .printing import Echo, ledger_of, say

__all__ = ["plan", "decide", "plan_status", "PlanStatus", "check_plan_weights", "plan_looks", "evidence_plan",
           "evidence_decide"]


def _existing(records, p_a: str, p_b: str, shas: Mapping[str, str | None], max_runs: int) -> tuple[int, int]:
    """Whole runs of A and B already recorded for the weights the plan names, refused past N."""
    counts = []
    for name in (p_a, p_b):
        n = sum(1 for r in records if r.model == name and not r.is_item and r.sha256 == shas.get(name))
        if n > max_runs:
            raise EvidenceError(f"--use-existing: {name} already has {n} runs of these weights, more than --max-runs "
                                f"{max_runs}; raise --max-runs to at least {n}")
        counts.append(n)
    return counts[0], counts[1]


def plan(ledger: Ledger, a: str, b: str, *, metric: str, min_effect: float, max_runs: int, alpha: float = 0.05,
         current_sha: Mapping[str, str | None] | None = None, kind: str = TEST, spending: str = "obf",
         look_every: int = 1, beta: float = 0.1, use_existing: bool = False, higher_is_better: bool | None = None,
         noise_sd: float | None = None) -> dict:
    """``vecmerge evidence plan A --vs B --metric M --min-effect D --max-runs N [--kind ...]``: record a plan.

    ``kind`` ``group-sequential`` (planned looks, ``planned.py``; default) or ``t-mixture`` (anytime-valid,
    ``sequential.py``). The metric's direction: ``higher_is_better`` when given (recorded if the ledger has none;
    a contradiction is refused), else the ledger's. The noise sd (``noise_sd``, else the ledger's pooled noise
    over A's and B's eval environment) sets the power figures (``plan_power.py``) and the mixture's prior scale
    D / sd. ``use_existing``: A's and B's runs of these weights recorded before the plan are its first look.

    Returns:
        dict: ``{"plan": Plan.to_dict(), "looks_from": record id, "power": PlanPower.to_dict()}``.
    """
    if kind not in PLAN_TESTS:
        raise EvidenceError(f"--kind {kind}: one of {', '.join(PLAN_TESTS)}")
    problems = Design(spending, look_every, beta).problems()
    if problems:
        raise EvidenceError(f"evidence plan: {problems[0]}")
    declared = ledger.direction(metric)
    if higher_is_better is not None and declared is not None and declared != higher_is_better:
        raise EvidenceError(f"{metric}: the ledger records {'higher' if declared else 'lower'} is better; the plan "
                            f"says {'higher' if higher_is_better else 'lower'}: drop the flag or fix the direction")
    direction = declared if declared is not None else higher_is_better
    if direction is None:
        raise EvidenceError(f"{metric}: no direction recorded; give it on the plan (--higher-is-better or "
                            "--lower-is-better) or declare it with evidence add/import")
    current = current_sha or {}
    records = ledger.records(metric=metric, current_sha=current_sha)
    envs = environments(r for r in records if r.model in (a, b)) or environments(records)
    if len(envs) == 1:
        env_id = next(iter(envs))
        records = [r for r in records if r.environment.id == env_id]
    noise = pooled_noise(runs_by_model(records)) if len(environments(records)) <= 1 else None
    sd = noise_sd if noise_sd is not None else (noise.sd if noise is not None and noise.sd > 0 else None)
    existing = _existing(records, a, b, {a: current.get(a), b: current.get(b)}, max_runs) if use_existing else None
    design = Design(spending, look_every, beta, existing)
    power = (plan_power(min_effect, max_runs, alpha, design, sd) if kind == TEST else
             anytime_power(min_effect, max_runs, alpha, sd, existing))
    stored: dict[str, Any] = {"sd_from": "--noise-sd" if noise_sd is not None else ("ledger" if sd else None),
              "existing": None if existing is None else list(existing), "power": power.to_dict()}
    if kind == TEST:
        stored.update(spending=spending, look_every=look_every, beta=beta)
    candidate = Plan(0, a, b, metric, current.get(a), current.get(b), min_effect, max_runs, alpha, direction, sd,
                     min_effect / sd if sd else 1.0, kind, design=stored)
    problems = candidate.problems()
    if problems:
        raise EvidenceError(f"no plan recorded: {problems[0]}")
    if declared is None:
        ledger.set_direction(metric, direction)
    made = ledger.add_plan(candidate)
    return {"plan": made.to_dict(), "looks_from": made.after_record + 1, "power": power.to_dict()}


@dataclass(frozen=True)
class PlanStatus:
    """Where a plan stands: its decision over its looks and the power it stated when it was made.

    Args:
        plan (Plan): the plan. decision (SequentialDecision): over its looks (``planned.decide_plan``).
        looks_used (int): looks taken. runs (tuple[int, int]): runs of A and B counted.
        power (dict | None): ``PlanPower.to_dict()`` as recorded (None: a plan older than schema 4).
    """

    plan: Plan
    decision: SequentialDecision
    looks_used: int
    runs: tuple[int, int]
    power: dict | None

    def to_dict(self, replay: bool = False) -> dict:
        return {"decision": self.decision.decision, "plan": self.plan.to_dict(), "looks_used": self.looks_used,
                "power": self.power, **{k: v for k, v in self.decision.to_dict(replay).items() if k != "decision"}}


def plan_status(ledger: Ledger, p: Plan, *, current_sha: Mapping[str, str | None] | None = None,
                env: EnvChoice | None = None) -> PlanStatus:
    """Plan ``p``'s state: its weights checked, its looks in one eval environment, its decision and power.

    Args:
        ledger (Ledger): the ledger. p (Plan): one of ``ledger.plans()``.
        current_sha (Mapping[str, str | None] | None): the names' sha256 now (other weights: refused).
        env (EnvChoice | None): the eval environment where the looks span several.
    """
    check_plan_weights(p, current_sha)
    looks = plan_looks(p, ledger.records([p.a, p.b], p.metric, include_stale=True), env)
    decision = decide_plan(p, looks)
    return PlanStatus(p, decision, len(decision.looks), decision.runs, (p.design or {}).get("power"))


def decide(ledger: Ledger, a: str, b: str, metric: str | None = None, *,
           current_sha: Mapping[str, str | None] | None = None, replay: bool = False,
           env: EnvChoice | None = None) -> dict:
    """``vecmerge evidence decide A --vs B [--metric M] [--replay] [--env ID|K=V]``: the latest plan's decision
    over its looks, in one eval environment (``plan_status``).

    Returns:
        dict: ``{"decision": stop_better | stop_worse | stop_futile | inconclusive | continue, "plan":
        Plan.to_dict(), "plans", "looks_used", "power", "reason", "runs", "after_stop", "beyond_max",
        "more_runs", "last": the last look's dict, "looks": [...] (replay only)}``.
    """
    plans = ledger.plans(a, b, metric)
    if not plans:
        raise EvidenceError(f"no plan of {a} --vs {b}" + (f" on {metric}" if metric else "") + f" in {ledger.path}; "
                            f"record one first: vecmerge evidence plan {a} --vs {b} --metric M --min-effect D "
                            "--max-runs N")
    if metric is None and len({p.metric for p in plans}) > 1:
        raise EvidenceError(f"plans of {a} --vs {b} on several metrics ({', '.join(sorted({p.metric for p in plans}))}"
                            "); name one with --metric")
    status = plan_status(ledger, plans[-1], current_sha=current_sha, env=env)
    return {**status.to_dict(replay), "plans": len(plans)}


def evidence_plan(ws: Workspace, req: EvidencePlan, *, echo: Echo = print) -> dict:
    """``vecmerge evidence plan A --vs B --metric M --min-effect D --max-runs N [--alpha A] [--kind K] ...``: record a
    plan, tied to A's and B's content sha256 now (names that are no adapter here: none), with its power."""
    metric = req.metric or ws.metric
    if metric is None:
        raise UsageError("evidence plan: name the metric with --metric M (or set metric: in vecmerge.yaml)")
    ledger = ledger_of(ws)
    a, b = req.a, req.b
    out = plan(ledger, a, b, metric=metric, min_effect=req.min_effect, max_runs=req.max_runs, alpha=req.alpha,
               current_sha={**ws.current_shas(ledger.models()), a: ws.content_sha(a), b: ws.content_sha(b)},
               kind=req.test, spending=req.spending, look_every=req.look_every, beta=req.beta,
               use_existing=req.use_existing, higher_is_better=req.higher_is_better, noise_sd=req.noise_sd)
    say(echo, out, report_plans.render_plan, req.as_json)
    return out


def evidence_decide(ws: Workspace, req: EvidenceDecide, *, echo: Echo = print) -> dict:
    """``vecmerge evidence decide A --vs B [--metric M] [--replay] [--env ID|K=V]``: the latest plan's sequential
    decision over its looks (one eval environment)."""
    ledger = ledger_of(ws)
    out = decide(ledger, req.a, req.b, req.metric, current_sha=ws.current_shas([req.a, req.b]), replay=req.replay,
                 env=EnvChoice.parse(req.env))
    say(echo, out, report_plans.render_decide, req.as_json)
    return out
