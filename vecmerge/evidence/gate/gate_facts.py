"""The ledger's part of the gate's facts: the backbone's runs and noise, the evidence for X over Y, the sub-scores
and the latest plan, all in ONE eval environment and, where replicates exist, with training noise.

``pipeline.gate_check`` gathers the workspace's facts and calls ``gate_evidence`` for the rest.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TypedDict

from ..judge.compare import Comparison, compare_records
from ..judge.subscores import SubScoreComparison, compare_subscores
from ..ledger.environment import EnvChoice, records_of_one_environment
from ..ledger.ledger import Ledger, Plan
from ..ledger.precision import of_metric
from ..ledger.precision import read as read_decimals
from ..stats.noise import PooledNoise, pooled_noise
from ..stats.planned import decide_plan
from ..stats.replicates import components, members
from ..stats.sequential import SequentialDecision, check_plan_weights, plan_looks
from ..stats.stats import runs_by_model
from ..stats.variance import VarianceComponents
from .gate import GateConfig


class GateEvidence(TypedDict):
    """The ledger's part of ``gate.GateFacts`` (its keyword arguments, as ``gate_evidence`` finds them)."""

    backbone_runs: tuple[float, ...]
    backbone_components: VarianceComponents | None
    typical_noise: PooledNoise | None
    comparison: Comparison
    subscores: SubScoreComparison
    plan: Plan | None
    plan_decision: SequentialDecision | None
    env: dict | None


def gate_evidence(ledger: Ledger, backbone: str, x: str, y: str, metric: str, *,
                  current_sha: Mapping[str, str | None] | None = None, config: GateConfig | None = None,
                  replicates: Mapping[str, Sequence[str]] | None = None, env: EnvChoice | None = None
                  ) -> GateEvidence:
    """The ledger's part of ``gate.GateFacts``.

    One eval environment: the one the records of BASE, X and Y (and their replicates) share, or the one ``env``
    (else the config's ``env``) picks; several are refused ("not the same measurement", naming the fields).
    In it: ``backbone_runs`` and, with replicates of the backbone, ``backbone_components`` (between trainings
    and within evaluations); ``typical_noise`` (pooled over the models outside the backbone's group);
    ``comparison`` (X vs Y at the config's confidence and min_evidence_runs, with their replicates); the
    protected sub-scores; the latest plan of X vs Y and its decision over its looks in that environment.

    Returns:
        GateEvidence: keyword arguments for ``GateFacts(backbone, x, y, ..., **gate_evidence(...))``.
    """
    c = config or GateConfig()
    choice = env if env else EnvChoice.parse(c.env, "gate.env")
    records = ledger.records(metric=metric, current_sha=current_sha)
    chosen, records = records_of_one_environment(records, members([backbone, x, y], replicates), choice,
                                                 f"gate: {backbone}, {x} and {y} on {metric}")
    runs = runs_by_model(records)
    group = members([backbone], replicates)
    keys = None if c.protect in (None, "all") else list(c.protect)
    direction = ledger.direction(metric)
    decimals = of_metric(read_decimals(ledger, metric), metric)
    subs = compare_subscores(x, y, records, metric=metric, higher_is_better=direction, confidence=c.confidence,
                             keys=keys, margins=c.margin, margin_source=c.source_of("margin"),
                             min_runs=c.min_evidence_runs, decimals=decimals)
    plans = ledger.plans(x, y, metric)
    latest = plans[-1] if plans else None
    decision = None
    if latest is not None:
        check_plan_weights(latest, current_sha)
        looks = [r for r in ledger.records([x, y], metric, include_stale=True)
                 if chosen is None or r.environment.id == chosen.id]
        decision = decide_plan(latest, plan_looks(latest, looks, None))
    env_id = chosen.id if chosen else None
    return {"backbone_runs": tuple(runs.get(backbone, [])),
            "backbone_components": components(backbone, replicates, runs, metric=metric, env=env_id,
                                              confidence=c.confidence),
            "typical_noise": pooled_noise({m: v for m, v in runs.items() if m not in group}),
            "comparison": compare_records(x, y, records, metric=metric, higher_is_better=direction,
                                          confidence=c.confidence, min_runs=c.min_evidence_runs,
                                          replicates=replicates, env=chosen.to_dict() if chosen else None,
                                          decimals=decimals),
            "subscores": subs, "plan": latest, "plan_decision": decision,
            "env": chosen.to_dict() if chosen else None}
