"""The gate: a merge step BASE + alpha*(X - Y) is worth trying only when all seven conditions hold.

A PURE function over facts the caller gathers (workspace, ledger, audit, trust): common base, common parent,
stable backbone (BASE's run sd, or with replicates sqrt(σ̂²_b + σ̂²_w), within its limit), repeated evidence
(X better than Y beyond noise, or a plan's sequential decision, or the test over trainings), module consensus
(agreeing share >= min_agree), small trust region (trust <= max_trust) and no sub-score regresses (every
protected sub-score not worse at its margin, Holm across them).

Each row is PASS, FAIL or UNKNOWN (no evidence to decide) with its numbers and the threshold's source.
UNKNOWN is not a pass: ``GateResult.passed`` only when all seven PASS. Every evidence row is of one eval
environment (``gate_facts.gate_evidence``; ``GateConfig.env`` picks one).
Each condition in full and where it comes from: docs/design/evidence.md.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ...workspace.lineage import Relation
from .. import EvidenceError
from ..difference import registry as tests
from ..difference.group_sequential import GROUP_SEQUENTIAL
from ..judge.compare import Comparison
from ..judge.subscores import NOT_WORSE, WORSE, SubScoreComparison
from ..ledger.records import Plan
from ..stats.noise import PooledNoise
from ..stats.sequential import CONTINUE, STOP_BETTER, SequentialDecision
from ..stats.stats import summarize
from ..stats.variance import VarianceComponents
from .gate_config import GateConfig, GateConfigError

__all__ = ["GateConfig", "GateConfigError", "GateFacts", "GateRow", "GateResult", "evaluate_gate", "PASS", "FAIL",
           "UNKNOWN", "CONDITIONS"]

PASS, FAIL, UNKNOWN = "PASS", "FAIL", "UNKNOWN"
CONDITIONS = ("common base", "common parent", "stable backbone", "repeated evidence", "module consensus",
              "small trust region", "no sub-score regresses")


@dataclass(frozen=True)
class GateFacts:
    """What the caller gathered for ``evaluate_gate`` (None / empty = not known: the row is UNKNOWN).

    Args:
        backbone, x, y (str): the names in BASE + alpha*(X - Y).
        base_models (Mapping[str, str | None]): each named adapter -> the base model it declares.
        shape_mismatches (Sequence[str] | None): descriptions of mismatched shapes; [] = checked and equal;
            None = not checked.
        lineage (Relation | None): ``lineage.relation(x, y, parents)``.
        closeness (Mapping[str, float] | None): supporting parameter-space figures of X to Y (shown, not judged).
        backbone_runs (Sequence[float]): the backbone's current whole-run values on the metric.
        typical_noise (PooledNoise | None): the ledger's pooled within-model noise on the metric, best over
            the OTHER models (``noise.pooled_noise`` of the runs without the backbone).
        comparison (Comparison | None): ``compare.compare_records(x, y, ...)`` on the metric with the config's
            confidence.
        consensus (tuple[int, int] | None): (modules agreeing, modules) in the audit against the reference.
        consensus_ref (str | None): the reference expression (e.g. ``v54 - v54e2``), for the report.
        trust (float | None): the step's relative size ||alpha*(X-Y)|| / ||BASE||.
        subscores (SubScoreComparison | None): X vs Y on the protected sub-scores with the config's margins.
        plan (Plan | None), plan_decision (SequentialDecision | None): the latest plan of X vs Y on the metric
            and its decision; the repeated-evidence row uses them when present.
        backbone_components (VarianceComponents | None): with replicates of the backbone, its variance components;
            the stable-backbone row then judges sqrt(σ̂²_b + σ̂²_w).
        env (dict | None): the eval environment of the evidence (``Environment.to_dict``), for the report.
    """

    backbone: str
    x: str
    y: str
    base_models: Mapping[str, str | None] = field(default_factory=dict)
    shape_mismatches: Sequence[str] | None = None
    lineage: Relation | None = None
    closeness: Mapping[str, float] | None = None
    backbone_runs: Sequence[float] = ()
    typical_noise: PooledNoise | None = None
    comparison: Comparison | None = None
    consensus: tuple[int, int] | None = None
    consensus_ref: str | None = None
    trust: float | None = None
    subscores: SubScoreComparison | None = None
    plan: Plan | None = None
    plan_decision: SequentialDecision | None = None
    backbone_components: VarianceComponents | None = None
    env: dict | None = None


@dataclass(frozen=True)
class GateRow:
    """One condition: status, the numbers behind it, the threshold and where the threshold came from."""

    condition: str
    status: str
    detail: str
    numbers: dict
    threshold: str
    source: str

    def to_dict(self) -> dict:
        return {"condition": self.condition, "status": self.status, "detail": self.detail, "numbers": self.numbers,
                "threshold": self.threshold, "source": self.source}


@dataclass(frozen=True)
class GateResult:
    """The seven rows; ``passed`` only when every row is PASS (exit code 0, else 1)."""

    rows: tuple[GateRow, ...]

    @property
    def passed(self) -> bool:
        return all(r.status == PASS for r in self.rows)

    @property
    def exit_code(self) -> int:
        return 0 if self.passed else 1

    def row(self, condition: str) -> GateRow:
        return next(r for r in self.rows if r.condition == condition)

    def to_dict(self) -> dict:
        return {"passed": self.passed, "rows": [r.to_dict() for r in self.rows]}


def _common_base(f: GateFacts) -> GateRow:
    names = list(dict.fromkeys([f.backbone, f.x, f.y, *f.base_models]))
    declared = {n: f.base_models.get(n) for n in names}
    numbers = {"base_models": declared, "shape_mismatches": None if f.shape_mismatches is None
               else list(f.shape_mismatches)}
    args = ("common base", numbers, "one base model declared by all, equal shapes", "rule")
    bases = sorted({b for b in declared.values() if b is not None})
    if len(bases) > 1:
        return GateRow(args[0], FAIL, f"different base models: {', '.join(bases)}", *args[1:])
    if f.shape_mismatches:
        return GateRow(args[0], FAIL, f"shapes differ: {f.shape_mismatches[0]}"
                       + (f" (and {len(f.shape_mismatches) - 1} more)" if len(f.shape_mismatches) > 1 else ""),
                       *args[1:])
    missing = [n for n, b in declared.items() if b is None]
    if missing:
        return GateRow(args[0], UNKNOWN, f"no base model declared by {', '.join(missing)}", *args[1:])
    if f.shape_mismatches is None:
        return GateRow(args[0], UNKNOWN, f"base {bases[0]}; shapes not checked", *args[1:])
    return GateRow(args[0], PASS, f"all on {bases[0]}, shapes match", *args[1:])


def _common_parent(f: GateFacts) -> GateRow:
    numbers = {"relation": f.lineage.to_dict() if f.lineage else None, "closeness": dict(f.closeness or {})}
    args = (numbers, "X and Y on one recorded lineage", "rule")
    if f.lineage is None:
        return GateRow("common parent", UNKNOWN, f"no lineage recorded for {f.x} and {f.y}", *args)
    if (f.lineage.x, f.lineage.y) != (f.x, f.y):
        raise EvidenceError(f"gate: the lineage is of {f.lineage.x} and {f.lineage.y}, the step is {f.x} - {f.y}")
    status = PASS if f.lineage.related else FAIL if f.lineage.kind == "unrelated" else UNKNOWN
    return GateRow("common parent", status, f.lineage.text, *args)


def _stable_backbone(f: GateFacts, c: GateConfig) -> GateRow:
    runs = list(f.backbone_runs)
    s = summarize(runs) if runs else None
    comp = f.backbone_components
    numbers = {"runs": len(runs), "mean": s.mean if s else None, "std": s.std if s else None,
               "typical_noise": f.typical_noise.to_dict() if f.typical_noise else None,
               "noise": "training plus evaluation" if comp else "evaluation",
               "components": comp.to_dict() if comp else None}
    if c.max_backbone_sd is not None:
        limit, limit_text, source = c.max_backbone_sd, f"std <= {c.max_backbone_sd:g}", c.source_of("max_backbone_sd")
    elif f.typical_noise is not None:
        limit = c.backbone_noise_factor * f.typical_noise.sd
        limit_text = (f"std <= {c.backbone_noise_factor:g} x pooled noise {f.typical_noise.sd:.4g} "
                      f"({len(f.typical_noise.models)} models, {f.typical_noise.df} df)")
        source = f"ledger; factor {c.source_of('backbone_noise_factor')}"
    else:
        limit, limit_text, source = None, "std <= the ledger's pooled noise (none recorded)", "ledger"
    numbers["limit"] = limit
    threshold = f">= {c.min_repeats} runs, {limit_text}"
    source = f"min_repeats {c.source_of('min_repeats')}; {source}"
    count = comp.evaluations if comp else len(runs)
    if not count:
        return GateRow("stable backbone", UNKNOWN, f"no runs of {f.backbone} recorded", numbers, threshold, source)
    if count < c.min_repeats:
        return GateRow("stable backbone", FAIL, f"{f.backbone}: {count} run(s) < {c.min_repeats}", numbers,
                       threshold, source)
    if comp is not None:
        spread = comp.sd_total
        said = (f"{f.backbone}: {comp.trainings} trainings ({', '.join(comp.members)}), {comp.evaluations} runs; "
                f"training plus evaluation noise sd {spread:.4g} (between trainings {comp.sd_training:.4g}, within "
                "evaluations " + f"{comp.sd_eval:.4g})")
    elif s is not None and s.n < 2:  # min_repeats 1 allows one run, whose spread is not measured
        return GateRow("stable backbone", UNKNOWN, f"{f.backbone}: 1 run, so its spread cannot be measured; "
                       "record another run or give replicates", numbers, threshold, source)
    elif s is not None:  # count = len(runs) >= min_repeats: runs to summarize
        spread = s.sd
        said = f"{f.backbone}: {s.n} runs, std {spread:.4g}"
    else:
        raise ValueError(f"gate: no runs of {f.backbone} to judge")
    if limit is None:
        return GateRow("stable backbone", UNKNOWN, f"{said}, no noise level to compare to", numbers, threshold, source)
    ok = spread <= limit
    only = "" if comp else f" (evaluation noise only: no replicates of {f.backbone})"
    return GateRow("stable backbone", PASS if ok else FAIL, f"{said} {'<=' if ok else '>'} {limit:.4g}{only}",
                   numbers, threshold, source)


def _repeated_evidence(f: GateFacts, c: GateConfig) -> GateRow:
    cmp = f.comparison
    threshold = (f"{f.x} better than {f.y} beyond eval noise ({c.confidence:.0%} interval excludes 0; "
                 f">= {c.min_evidence_runs} runs each for Welch)")
    source = f"confidence {c.source_of('confidence')}; min_evidence_runs {c.source_of('min_evidence_runs')}"
    if cmp is not None and (cmp.a, cmp.b) != (f.x, f.y):
        raise EvidenceError(f"gate: the comparison is {cmp.a} vs {cmp.b}, the step is {f.x} - {f.y}")
    reps = cmp.replicates if cmp is not None else None
    if reps is not None and reps.test is not None:
        return _training_evidence(f, c, source)
    if f.plan is not None and f.plan_decision is not None:
        return _planned_evidence(f)
    if cmp is None:
        return GateRow("repeated evidence", UNKNOWN, f"no comparison of {f.x} and {f.y}", {}, threshold, source)
    if cmp.confidence != c.confidence:
        raise EvidenceError(f"gate: the comparison used confidence {cmp.confidence}, the gate {c.confidence}")
    numbers = {**cmp.to_dict(), "noise": "evaluation"}
    text = f"{cmp.verdict} on {cmp.metric}" + (f" ({cmp.decided_by})" if cmp.decided_by else "")
    d = dict(cmp.tests)[cmp.decided_by] if cmp.decided_by else None
    if d is not None and tests.get(d.kind).needs == tests.RUNS and min(d.n) < c.min_evidence_runs:
        return GateRow("repeated evidence", UNKNOWN, f"{text}; runs {d.n} < {c.min_evidence_runs} each",
                       numbers, threshold, source)
    status = {"a_better": PASS, "b_better": FAIL, "within_noise": FAIL}.get(cmp.verdict_code, UNKNOWN)
    if d is not None:
        text += f": diff {d.diff:+.4g}, CI [{d.ci_low:.4g}, {d.ci_high:.4g}], p {d.p:.3g}"
    why = "" if reps is None else f"; {reps.reason}"
    text += f" (evaluation noise only: no replicates of {f.x} or {f.y}{why})"
    return GateRow("repeated evidence", status, text, numbers, threshold, source)


def _training_evidence(f: GateFacts, c: GateConfig, source: str) -> GateRow:
    """The repeated-evidence row from the test over trainings (``replicates.py``): training plus evaluation noise."""
    cmp = f.comparison
    reps = cmp.replicates if cmp is not None else None
    if cmp is None or reps is None or reps.test is None or reps.noise is None:
        raise ValueError("gate: the training evidence row reads the replicates' test (a caller's error)")
    d, noise = reps.test, reps.noise
    threshold = (f"{f.x} better than {f.y} beyond training plus evaluation noise ({c.confidence:.0%} interval "
                 "over trainings excludes 0)")
    numbers = {**cmp.to_dict(), "noise": "training plus evaluation"}
    if cmp.higher_is_better is None:
        status, said = UNKNOWN, f"no direction recorded for {cmp.metric}"
    elif not d.beyond_noise:
        status, said = FAIL, "within training plus evaluation noise"
    else:
        better = (d.diff > 0) == cmp.higher_is_better
        status, said = (PASS, f"{f.x} is better") if better else (FAIL, f"{f.y} is better")
        said += " beyond training plus evaluation noise"
    ka, kb = d.n
    text = (f"{said} on {cmp.metric}, over trainings ({ka} of {f.x}: {', '.join(reps.trainings[0])}; {kb} of {f.y}: "
            f"{', '.join(reps.trainings[1])}): diff {d.diff:+.4g}, CI [{d.ci_low:.4g}, {d.ci_high:.4g}], p {d.p:.3g}; "
            f"sd of a training's mean {noise.sd:.4g} ({noise.df} df)")
    if f.plan is not None and f.plan_decision is not None:
        text += f"; plan {f.plan.id} (evaluation noise only) says {f.plan_decision.decision}"
    return GateRow("repeated evidence", status, text, numbers, threshold, source)


def _consensus(f: GateFacts, c: GateConfig) -> GateRow:
    threshold, source = f"agreeing share >= {c.min_agree:g}", c.source_of("min_agree")
    ref = f" against {f.consensus_ref}" if f.consensus_ref else ""
    if f.consensus is None or f.consensus[1] <= 0:
        return GateRow("module consensus", UNKNOWN, f"no consensus audit{ref}", {}, threshold, source)
    agree, total = f.consensus
    share = agree / total
    numbers = {"agree": agree, "modules": total, "share": share, "ref": f.consensus_ref}
    return GateRow("module consensus", PASS if share >= c.min_agree else FAIL,
                   f"{agree}/{total} modules agree{ref} ({share:.1%})", numbers, threshold, source)


def _trust(f: GateFacts, c: GateConfig) -> GateRow:
    threshold, source = f"trust <= {c.max_trust:g}", c.source_of("max_trust")
    if f.trust is None:
        return GateRow("small trust region", UNKNOWN, "no trust (relative step) given", {}, threshold, source)
    ok = f.trust <= c.max_trust
    return GateRow("small trust region", PASS if ok else FAIL,
                   f"step {f.trust:.4g} ({f.trust:.2%} of {f.backbone}) {'<=' if ok else '>'} {c.max_trust:g}",
                   {"trust": f.trust}, threshold, source)


def _planned_evidence(f: GateFacts) -> GateRow:
    """The repeated-evidence row from the plan's decision (``planned.decide_plan``)."""
    p, d = f.plan, f.plan_decision
    if p is None or d is None:
        raise ValueError("gate: the planned evidence row reads the plan and its decision (a caller's error)")
    status = {STOP_BETTER: PASS, CONTINUE: UNKNOWN}.get(d.decision, FAIL)
    kind = "planned looks" if p.test == GROUP_SEQUENTIAL.name else "anytime-valid"
    threshold = (f"plan {p.id}: {f.x} better than {f.y}, {kind} ({p.test}, alpha {p.alpha:g}, "
                 f"D {p.min_effect:g}, <= {p.max_runs} runs each)")
    text = f"{d.decision} after {d.runs[0]} + {d.runs[1]} planned runs: {d.reason}"
    return GateRow("repeated evidence", status, text, {"plan": p.to_dict(), "decision": d.to_dict(replay=False)},
                   threshold, f"evidence plan {p.id} ({p.created})")


def _no_regression(f: GateFacts, c: GateConfig) -> GateRow:
    s = f.subscores
    protect = "all recorded" if c.protect in (None, "all") else ", ".join(c.protect)
    margin = ("one grade, else the pooled noise sd" if c.margin is None else f"{c.margin:g}"
              if isinstance(c.margin, float) else ", ".join(f"{k} {v:g}" for k, v in c.margin.items()))
    threshold = f"protect {protect}: each not worse than {f.y} by its margin ({margin}; one-sided, Holm)"
    source = f"protect {c.source_of('protect')}; margin {c.source_of('margin')}"
    if s is None:
        return GateRow("no sub-score regresses", UNKNOWN, f"no sub-score comparison of {f.x} and {f.y}", {},
                       threshold, source)
    if (s.a, s.b) != (f.x, f.y):
        raise EvidenceError(f"gate: the sub-score comparison is {s.a} vs {s.b}, the step is {f.x} - {f.y}")
    numbers = s.to_dict()
    if not s.rows:
        return GateRow("no sub-score regresses", PASS, f"no sub-scores recorded for {f.x} or {f.y} on {s.metric}: "
                       "none to protect", numbers, threshold, source)
    worse = [r for r in s.rows if r.status == WORSE]
    if worse:
        text = "; ".join(f"{r.key} worse ({r.diff:+.4g}: {r.reason})" for r in worse)
        return GateRow("no sub-score regresses", FAIL, text, numbers, threshold, source)
    unknown = [r for r in s.rows if r.status != NOT_WORSE]
    if not unknown:
        return GateRow("no sub-score regresses", PASS, f"{len(s.rows)} sub-score(s) not worse than {f.y}: "
                       + ", ".join(r.key for r in s.rows), numbers, threshold, source)
    text = f"{len(unknown)} of {len(s.rows)} undecided: " + "; ".join(
        f"{r.key} ({r.reason}" + (f"; about {r.more_runs} more run(s) each" if r.more_runs else "") + ")"
        for r in unknown)
    return GateRow("no sub-score regresses", UNKNOWN, text, numbers, threshold, source)


def evaluate_gate(facts: GateFacts, config: GateConfig | None = None) -> GateResult:
    """The seven rows for ``facts`` under ``config`` (defaults when None); see the module docstring."""
    c = config or GateConfig()
    return GateResult((_common_base(facts), _common_parent(facts), _stable_backbone(facts, c),
                       _repeated_evidence(facts, c), _consensus(facts, c), _trust(facts, c),
                       _no_regression(facts, c)))
