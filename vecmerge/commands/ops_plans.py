"""The pre-registered plans: ``evidence plan`` records one, ``evidence decide`` judges its looks anytime-validly.

``check_plan_weights`` and ``plan_looks`` live in ``evidence.stats.sequential``, shared with the gate
(``evidence.gate.gate_facts``): a plan holds only for the weights it names, and its looks are read in one eval
environment.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..evidence import EvidenceError
from ..evidence.ledger.environment import EnvChoice, environments
from ..evidence.ledger.ledger import Ledger, Plan
from ..evidence.stats.noise import pooled_noise
from ..evidence.stats.sequential import TEST, check_plan_weights, decide_plan, plan_looks
from ..evidence.stats.stats import runs_by_model

__all__ = ["plan", "decide", "check_plan_weights", "plan_looks"]


def plan(ledger: Ledger, a: str, b: str, *, metric: str, min_effect: float, max_runs: int, alpha: float = 0.05,
         current_sha: Mapping[str, str | None] | None = None) -> dict:
    """``vecmerge evidence plan A --vs B --metric M --min-effect D --max-runs N [--alpha 0.05]``: record a plan.

    The metric's direction must be declared; the ledger's pooled noise now sets the prior scale (D / sd), over
    the eval environment of A's and B's runs (pooled over all models' runs only where one environment holds all).
    Returns ``{"plan": Plan.to_dict(), "looks_from": record id}``: runs recorded after it are its looks.
    """
    direction = ledger.direction(metric)
    if direction is None:
        raise EvidenceError(f"{metric}: no direction recorded; declare it first (evidence add ... "
                            "--higher-is-better, or evidence import --higher-is-better METRIC)")
    current = current_sha or {}
    records = ledger.records(metric=metric, current_sha=current_sha)
    envs = environments(r for r in records if r.model in (a, b)) or environments(records)
    if len(envs) == 1:
        env_id = next(iter(envs))
        records = [r for r in records if r.environment.id == env_id]
    noise = pooled_noise(runs_by_model(records)) if len(environments(records)) <= 1 else None
    sd = noise.sd if noise is not None and noise.sd > 0 else None
    made = ledger.add_plan(Plan(0, a, b, metric, current.get(a), current.get(b), min_effect, max_runs, alpha,
                                direction, sd, min_effect / sd if sd else 1.0, TEST))
    return {"plan": made.to_dict(), "looks_from": made.after_record + 1}


def decide(ledger: Ledger, a: str, b: str, metric: str | None = None, *,
           current_sha: Mapping[str, str | None] | None = None, replay: bool = False,
           env: EnvChoice | None = None) -> dict:
    """``vecmerge evidence decide A --vs B [--metric M] [--replay] [--env ID|K=V]``: the latest plan's anytime-valid
    decision over its looks, in one eval environment.

    Returns:
        dict: ``{"decision": stop_better | stop_futile | continue, "plan": Plan.to_dict(), "reason", "runs",
        "after_stop", "beyond_max", "more_runs", "last": Look.to_dict(), "looks": [...] (replay only)}``.
    """
    plans = ledger.plans(a, b, metric)
    if not plans:
        raise EvidenceError(f"no plan of {a} --vs {b}" + (f" on {metric}" if metric else "") + f" in {ledger.path}; "
                            f"record one first: vecmerge evidence plan {a} --vs {b} --metric M --min-effect D "
                            "--max-runs N")
    if metric is None and len({p.metric for p in plans}) > 1:
        raise EvidenceError(f"plans of {a} --vs {b} on several metrics ({', '.join(sorted({p.metric for p in plans}))}"
                            "); name one with --metric")
    latest = plans[-1]
    check_plan_weights(latest, current_sha)
    looks = plan_looks(latest, ledger.records([a, b], latest.metric, include_stale=True), env)
    decision = decide_plan(latest, looks)
    return {"decision": decision.decision, "plan": latest.to_dict(), "plans": len(plans),
            **{k: v for k, v in decision.to_dict(replay).items() if k != "decision"}}
