"""The gate before a step BASE + alpha*(X - Y): the seven conditions of ``evidence.gate``, with their facts.

The facts come from the workspace, the evidence ledger and this pipeline's own computations, never from a
second implementation: declared base models (``base_model.declared_base``) and shapes; ``Workspace.lineage``
with cos(X, Y) and ||X - Y|| / ||Y||; the ledger's current records in one environment with the replicate
groups (``evidence.gate_facts.gate_evidence``); ``consensus_rows`` of ``evaluate_cores``; and the realized
relative step ``||alpha dir'|| / ||base||`` (``StepSize.realized``, the largest dose; else trust x dose).
``check_gate`` returns the result and the completed evaluation, so ``run`` writes from the very evaluation
the gate judged. Each fact's source in full: docs/design/pipeline.md.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..analysis.consensus import summarize as summarize_consensus
from ..errors import CheckFailed, RecipeError, UsageError, VecmergeError, shown
from ..evidence.gate.gate import GateConfig, GateFacts, GateResult, evaluate_gate
from ..evidence.gate.gate_facts import GateEvidence, gate_evidence
from ..evidence.ledger.ledger import Ledger
from ..expr import parse
from ..linalg.threads import Progress
from ..recipe.recipe import Recipe
from ..workspace.base_model import declared_base
from ..workspace.lineage import relation
from ..workspace.names import Workspace
from ..workspace.taskvector import TaskVector
from .evaluation import Evaluation, complete, consensus_rows, evaluate_cores
from .inputs import output_plan


class GateFailed(CheckFailed):
    """The gate did not pass (exit 1, nothing written); ``check`` holds its table."""

    def __init__(self, check: GateCheck):
        self.check = check
        bad = [f"{r.condition} {r.status}" for r in check.result.rows if r.status != "PASS"]
        super().__init__(f"gate: {len(bad)} of {len(check.result.rows)} conditions did not pass "
                         f"({', '.join(bad)}); nothing written")


@dataclass(frozen=True)
class GateCheck:
    """The gate's result with what it was judged on.

    Args:
        result (GateResult): the seven rows. config (GateConfig): the thresholds and their sources.
        metric (str | None): the metric of the evidence rows. ledger (str): the ledger file read.
        backbone, x, y (str): the step BASE + alpha*(X - Y).
        evaluation (Evaluation | None): the completed evaluation (None when it was not computed).
        error (VecmergeError | None): the consensus decision's refusal, raised by ``run`` after a passing gate.
        env (dict | None): the eval environment of the evidence rows (``Environment.to_dict``).
    """

    result: GateResult
    config: GateConfig
    metric: str | None
    ledger: str
    backbone: str
    x: str
    y: str
    evaluation: Evaluation | None = None
    error: VecmergeError | None = None
    env: dict | None = None

    @property
    def passed(self) -> bool:
        return self.result.passed

    def to_dict(self) -> dict:
        """What reports and manifests carry: the verdict, the step, the metric, the ledger and the rows."""
        return {"passed": self.passed, "backbone": self.backbone, "x": self.x, "y": self.y, "metric": self.metric,
                "ledger": self.ledger, **({"env": self.env} if self.env and self.env.get("fields") else {}),
                "rows": [r.to_dict() for r in self.result.rows]}


def step_names(recipe: Recipe) -> tuple[str, str, str]:
    """``(backbone, x, y)`` of a recipe BASE + alpha*(X - Y); RecipeError for any other shape."""
    base = parse(recipe.base) if recipe.base is not None else None
    names = base.names() if base is not None else []
    if base is None or len(names) != 1 or base.coeffs[names[0]] != 1.0:
        raise RecipeError([f"gate: base {recipe.base!r} must be one adapter name (the backbone whose runs the "
                           "ledger holds)"])
    d = parse(recipe.dir) if recipe.dir else None
    pos = [n for n, c in (d.coeffs.items() if d else ()) if c == 1.0]
    neg = [n for n, c in (d.coeffs.items() if d else ()) if c == -1.0]
    if d is None or len(d.coeffs) != 2 or len(pos) != 1 or len(neg) != 1:
        raise RecipeError([f"gate: dir {recipe.dir!r} must be X - Y of two adapters (e.g. v51 - v28): the "
                           "evidence compares X with Y"])
    return names[0], pos[0], neg[0]


def gate_config(ws: Workspace, recipe_gate: bool | dict | None = None) -> GateConfig:
    """The workspace's ``gate:`` thresholds, overridden key by key by a recipe's ``gate:`` mapping."""
    config = GateConfig.from_dict(ws.gate, source=shown(ws.file) if ws.file else "vecmerge.yaml")
    if isinstance(recipe_gate, dict) and recipe_gate:
        over = GateConfig.from_dict(recipe_gate, source="recipe")
        config = dataclasses.replace(config, **{k: getattr(over, k) for k in recipe_gate},
                                     sources={**config.sources, **over.sources})
    return config


def gate_metric(config: GateConfig, ws: Workspace, ledger: Ledger) -> str | None:
    """The metric the evidence rows use: the gate's ``metric``, the workspace's ``metric:``, else the ledger's
    only metric (None for an empty ledger). UsageError when it must be named, or names no recorded metric."""
    known = ledger.metrics()
    metric = config.metric or ws.metric
    if metric is None:
        if len(known) > 1:
            raise UsageError(f"gate: {ledger.path} holds metrics {', '.join(known)}; name one with --metric "
                             "(or metric: in vecmerge.yaml)")
        return known[0] if known else None
    if known and metric not in known:
        raise UsageError(f"gate: metric {metric!r} has no records in {ledger.path}; known: {', '.join(known)}")
    return metric


def shape_mismatches(adapters: dict) -> list[str]:
    """Modules whose layout differs between the named adapters, and pairs that share no module."""
    out, first = [], {}
    for name, a in adapters.items():
        for m, spec in a.specs.items():
            if m not in first:
                first[m] = (name, spec)
                continue
            n0, s0 = first[m]
            if (spec.shape, spec.transposed) != (s0.shape, s0.transposed):
                out.append(f"{m}: {name} {spec.weight_shape} vs {n0} {s0.weight_shape}")
    names = list(adapters)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            if not set(adapters[a].specs) & set(adapters[b].specs):
                out.append(f"{a} and {b} share no module")
    return out


def _closeness(vx: TaskVector, vy: TaskVector, dist: float) -> dict:
    """``cos(X, Y) = <X, Y> / (||X|| ||Y||)`` (shared modules; a missing one counts as zero) and
    ``||X - Y|| / ||Y||`` (``dist``: the norm of the direction's cores), the gate's supporting figures."""
    nx, ny = vx.norm(), vy.norm()
    inner = sum(vx[m].inner(vy[m]) for m in vx.modules if m in vy.modules)
    return {"cosine": inner / (nx * ny) if nx > 0 and ny > 0 else None,
            "relative_distance": dist / ny if ny > 0 else None}


def check_gate(recipe: Recipe, ws: Workspace, progress: Progress | None = None) -> GateCheck:
    """Gather the facts for the recipe's step and evaluate the gate (see the module docstring).

    Args:
        recipe (Recipe): BASE + alpha*(X - Y), its consensus reference, trust or alpha (both optional here:
            without them the trust row is UNKNOWN), and ``gate`` (threshold overrides, metric).
        ws (Workspace): names, lineage, the ledger and the ``gate:`` thresholds.
        progress: optional callable wrapping the module iterable (a tqdm bar).

    Returns:
        GateCheck; input errors (unreadable adapters, a lineage cycle, an unknown metric) raise as usual.
    """
    backbone, x, y = step_names(recipe)
    config = gate_config(ws, recipe.gate)
    ref = parse(recipe.consensus.ref).names() if recipe.consensus else []
    names = list(dict.fromkeys([backbone, x, y, *ref]))
    pinned = ws.with_inputs({n: e["path"] for n, e in recipe.inputs.items()})
    adapters = {n: pinned.adapter(n, recipe.modules_to_save) for n in names}
    mismatches = shape_mismatches(adapters)
    parents, roots = pinned.lineage(names)
    ledger = Ledger(pinned.ledger_path)
    metric = gate_metric(config, pinned, ledger)
    evidence: GateEvidence | None = None  # no metric: the gate's rows say what is missing
    if metric is not None:
        evidence = gate_evidence(ledger, backbone, x, y, metric, current_sha=pinned.current_shas(ledger.models()),
                                 config=config, replicates=pinned.replicate_groups())
    consensus = closeness = ev = error = None
    multiples = [k for k, _ in output_plan(recipe)]
    trust = recipe.trust * max(multiples) if recipe.trust is not None else None  # until the step is computed
    if not mismatches:
        # the gate states a base-model mismatch in its own "common base" row; the other facts are still measured
        cores = evaluate_cores(dataclasses.replace(recipe, allow_base_mismatch=True), ws, progress)
        rows = consensus_rows(cores)
        if rows is not None:
            s = summarize_consensus(rows)
            consensus = (s["agree"], s["modules"] - s["zero"])  # a module zero on one side has no sign
        closeness = _closeness(cores.vectors[x], cores.vectors[y], cores.operands["dir"].norm())
        if recipe.trust is not None or recipe.alpha is not None:
            try:
                ev = complete(cores, rows)
                if ev.step is not None:  # a step recipe (``step_names``) is stepped: complete chose its alpha
                    trust = max(ev.step.realized(k)["global"] for k in multiples)
            except CheckFailed as e:  # the consensus decision: the gate's table shows why first
                error = e
    base_models = {n: declared_base(a.config.base_model, (pinned.home,)) for n, a in adapters.items()}
    facts = GateFacts(backbone, x, y, base_models=base_models,
                      shape_mismatches=mismatches, lineage=relation(x, y, parents, roots=roots),
                      closeness=closeness, consensus=consensus,
                      consensus_ref=recipe.consensus.ref if recipe.consensus else None, trust=trust)
    if evidence is not None:
        facts = dataclasses.replace(facts, **evidence)
    return GateCheck(evaluate_gate(facts, config), config, metric, str(ledger.path), backbone, x, y, ev, error,
                     evidence["env"] if evidence else None)
