"""A candidate judged by forward passes with probe's hooks: the target's gain, each protected set's change.

Per prompt set and item ``i`` (probe's teacher-forced ``loglik``: the target tokens' log-likelihood, nats)::

    change_i  = loglik_i(candidate) - loglik_i(backbone)              (paired per item)
    mean, SE  = the mean of change_i, and sd(change_i, ddof 1) / sqrt(n)
    lower     = mean - 1.645 SE                                       (the one-sided 95% lower bound)

The objective is the target set's ``mean``; a candidate is feasible when every protected set's ``lower >= -M``
(M the margin, per set or one for all) and its step ``||alpha D'|| / ||backbone|| <= trust_max``. Every
candidate's item scores go into the ledger under its recipe hash (``Candidate.key``, ``sha256``) and the prompt
file's sha256, one transaction per candidate, so a re-run computes only the candidates it lacks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from ..evidence.ledger import pairs as pair_records
from ..evidence.ledger.ledger import Ledger
from ..probe import records
from ..probe.hooks import LoraHooks
from ..probe.runner import _batch_tensors, _keeps_positions, forward_logits
from ..probe.scores import item_scores

Z = 1.645  # one-sided 95%
BOUND = "lower one-sided 95% bound: mean - 1.645 * SE (SE = sd of the paired per-item changes / sqrt(n))"


class Scorer:
    """The loaded base with hooks on every module, and each prompt set cut into batches once.

    Args:
        model (torch.nn.Module): the loaded base (``probe.runner.load_base``). modules (Iterable[str]): hooked.
        sets (dict[str, PromptSet]): name -> items. batch (int): items per forward pass. device: where they run.
    """

    def __init__(self, model, modules, sets: dict, *, batch: int = 8, device="cpu"):
        self.model, self.sets, self.device = model, sets, torch.device(device)
        self.by_mask = _keeps_positions(model)
        self.hooks = LoraHooks(model, modules)
        self.batches: dict[str, list] = {}
        for name, ps in sets.items():
            items = sorted(ps.items, key=lambda it: (-it.length, it.line))
            self.batches[name] = [(chunk, _batch_tensors(chunk, self.device))
                                  for chunk in (items[i:i + batch] for i in range(0, len(items), batch))]
        self.forwards = 0

    def scores(self, updates: dict, names=None) -> dict[str, dict[str, dict]]:
        """``{set: {item id: {loglik, exact, first_rank}}}`` with ``updates`` on (``names``: those sets only)."""
        self.hooks.use(updates)
        out: dict[str, dict] = {}
        try:
            for name in (names if names is not None else self.sets):
                got = out.setdefault(name, {})
                for chunk, (ids, att, keep, targets, lengths) in self.batches[name]:
                    s = item_scores(forward_logits(self.model, ids, att, keep, self.by_mask), targets, lengths)
                    self.forwards += 1
                    got.update({it.id: {k: s[k][j] for k in records.ITEM_METRICS} for j, it in enumerate(chunk)})
        finally:
            self.hooks.use(None)
        return out

    def close(self) -> None:
        self.hooks.remove()


def cached(ledger: Ledger | None, sets: dict, key: str, sha: str) -> dict[str, dict]:
    """What ``ledger`` holds of ``key`` (recipe hash ``sha``) per set: only sets with every item recorded."""
    if ledger is None:
        return {}
    out = {}
    for name, ps in sets.items():
        items = records.load_cache(ledger, ps, {key: sha}).items.get(key, {})
        if all(i in items for i in ps.ids):
            out[name] = items
    return out


def record(ledger: Ledger | None, sets: dict, key: str, sha: str, scores: dict) -> int:
    """Write ``scores`` (``Scorer.scores``) of ``key`` for every set in ONE transaction; the records written."""
    if ledger is None or not scores:
        return 0
    entries, directions = [], {}
    for name, items in scores.items():
        entries += records.item_entries(sets[name], key, sha, items)
        directions.update(records.directions(sets[name].stem))
    ids, _ = pair_records.write(ledger, entries, [], directions)
    return len(ids)


@dataclass(frozen=True)
class SetFigures:
    """One set's paired change from the backbone: ``mean``, ``se``, ``lower`` (``mean - Z se``), ``n``."""

    mean: float
    se: float
    lower: float
    n: int

    def to_dict(self) -> dict:
        return {"mean": self.mean, "se": self.se, "lower": self.lower, "n": self.n}


def paired(after: dict, before: dict) -> SetFigures:
    """The module docstring's figures of ``after[i] - before[i]`` over the items (logliks)."""
    d = [after[i]["loglik"] - before[i]["loglik"] for i in before]
    n = len(d)
    mean = math.fsum(d) / n
    se = math.sqrt(math.fsum((x - mean) ** 2 for x in d) / (n - 1) / n) if n > 1 else math.inf
    return SetFigures(mean, se, mean - Z * se, n)


@dataclass(frozen=True)
class Result:
    """One evaluated candidate: its figures, whether it is feasible and why not, and whether it was computed.

    Args:
        sha256 (str), params (dict), recipe (dict): the candidate. target (dict[str, SetFigures]).
        protect (dict[str, SetFigures]). alpha, step, kept_direction (float): ``candidate.Built``'s.
        feasible (bool). violations (list[str]). computed (bool): False when replayed from the ledger.
    """

    sha256: str
    params: dict
    recipe: dict
    target: dict
    protect: dict
    alpha: float | None
    step: float | None
    kept_direction: float | None
    feasible: bool
    violations: list = field(default_factory=list)
    computed: bool = True
    margins: dict = field(default_factory=dict)

    @property
    def objective(self) -> float:
        return next(iter(self.target.values())).mean if self.target else -math.inf

    @property
    def worst_set(self) -> str | None:
        """The protected set closest to (or past) its own margin: the lowest ``lower + M`` (None without sets)."""
        return min(self.protect, key=lambda k: (self.protect[k].lower + self.margins.get(k, 0.0), k), default=None)

    @property
    def slack(self) -> float:
        """What decides feasibility: ``min_k (lower_k + M_k)``, >= 0 when every set holds (0 without sets)."""
        k = self.worst_set
        return 0.0 if k is None else self.protect[k].lower + self.margins.get(k, 0.0)

    @property
    def worst(self) -> float:
        """The mean change of ``worst_set`` (0 without protected sets)."""
        k = self.worst_set
        return 0.0 if k is None else self.protect[k].mean

    def constraints(self, margins: dict, trust_max: float) -> list[float]:
        """Optuna's form: one value per constraint, ``<= 0`` when it holds (``-M - lower`` per set, the step)."""
        out = [-margins[k] - f.lower for k, f in self.protect.items()]
        return out + [(self.step if self.step is not None else math.inf) - trust_max]

    def to_dict(self) -> dict:
        return {"sha256": self.sha256, "params": self.params, "recipe": self.recipe, "objective": self.objective,
                "worst_protected": self.worst, "worst_set": self.worst_set,
                "worst_lower": self.protect[self.worst_set].lower if self.worst_set else None, "slack": self.slack,
                "target": {k: v.to_dict() for k, v in self.target.items()},
                "protect": {k: v.to_dict() for k, v in self.protect.items()}, "alpha": self.alpha,
                "step": self.step, "kept_direction": self.kept_direction, "feasible": self.feasible,
                "violations": self.violations, "computed": self.computed}


def judge(c, built, after: dict, before: dict, *, targets, protect, margins: dict, trust_max: float,
          computed: bool) -> Result:
    """The candidate's ``Result`` from its scores ``after`` and the backbone's ``before`` (per set, per item).

    Args:
        c (Candidate). built (Built | None): its step (None: the candidate has a problem, no scores).
        targets, protect (Iterable[str]): set names. margins (dict[str, float]): M per protected set.
        trust_max (float): the step bound. computed (bool): scored now (False: replayed).
    """
    if built is None:
        return Result(c.sha256, c.params, c.recipe, {}, {}, None, None, None, False, [c.problem or "no step"],
                      computed, dict(margins))
    t = {k: paired(after[k], before[k]) for k in targets}
    p = {k: paired(after[k], before[k]) for k in protect}
    bad = [f"{k}: lower bound {f.lower:.4g} < -{margins[k]:g}" for k, f in p.items() if f.lower < -margins[k]]
    if built.step > trust_max * (1 + 1e-9):
        bad.append(f"step {built.step:.4g} > trust_max {trust_max:g}")
    return Result(c.sha256, c.params, c.recipe, t, p, built.alpha, built.step, built.kept_direction, not bad, bad,
                  computed, dict(margins))
