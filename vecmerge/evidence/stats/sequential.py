"""Pre-registered sequential decisions: when to stop spending official runs (an anytime-valid t test).

A plan fixes D (the smallest difference worth finding), N (the most runs per model) and alpha first; the
confidence sequence below then holds at every look, however many. With d = mean_A - mean_B, pooled s_p on
ν = n_A + n_B - 2 df, n_e = n_A n_B / (n_A + n_B), t = (d - Δ0) / (s_p sqrt(1/n_A + 1/n_B)), s² = 1 + n_e g:

    E(Δ0) = (1/s) [(1 + t²/ν) / (1 + t²/(ν s²))]^((ν+1)/2)        (Gaussian-mixture t test; Ville: P <= α)
    CS = d ± c s_p sqrt(1/n_A + 1/n_B),  K = (s/α)^(2/(ν+1)),  c² = ν (K - 1) / (1 - K/s²) if K < s² else ∞

At each look the first that applies: stop_better (lower end > 0), stop_worse (upper end < 0), stop_futile
(upper end < D), inconclusive (N runs each, no stop), continue. The first stop is final. Prior scale:
g = prior_scale², prior_scale = D / the ledger's pooled noise sd when the plan was made (1 without one).
The derivation, its references and assumptions: docs/design/evidence.md.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

from .. import EvidenceError
from ..difference.t_mixture import T_MIXTURE
from ..ledger.environment import EnvChoice, one_environment
from ..ledger.records import Plan, Record

if TYPE_CHECKING:  # planned imports this module
    from .planned import PlannedLook

STOP_BETTER, STOP_WORSE, STOP_FUTILE = "stop_better", "stop_worse", "stop_futile"
INCONCLUSIVE, CONTINUE = "inconclusive", "continue"
DECISIONS = (STOP_BETTER, STOP_WORSE, STOP_FUTILE, INCONCLUSIVE, CONTINUE)
TEST = T_MIXTURE.name


def add_run(n: dict, mean: dict, ss: dict, model: str, value: float) -> None:
    """Welford's one-pass update of a model's count, mean and sum of squared deviations by one run.

    ``n += 1; mean += (x - mean) / n; ss += (x - mean_old) (x - mean_new)``.

    Args:
        n, mean, ss (dict[str, int | float]): per model, updated in place. model (str). value (float): the run.
    """
    n[model] += 1
    delta = value - mean[model]
    mean[model] += delta / n[model]
    ss[model] += delta * (value - mean[model])

def mixture_e_value(t: float, nu: float, n_eff: float, g: float) -> float:
    """E = (1/s) [(1 + t²/ν) / (1 + t²/(ν s²))]^((ν+1)/2), s² = 1 + n_e g (module docstring); t may be ±inf."""
    s2 = 1.0 + n_eff * g
    if math.isinf(t):
        return s2 ** (nu / 2)  # the supremum s^ν
    return math.exp((nu + 1) / 2 * (math.log1p(t * t / nu) - math.log1p(t * t / (nu * s2))) - 0.5 * math.log(s2))


def mixture_boundary(nu: float, n_eff: float, g: float, alpha: float) -> float:
    """c with E(c) = 1/α: c² = ν (K - 1)/(1 - K/s²), K = (s/α)^(2/(ν+1)), s² = 1 + n_e g; ``inf`` when K >= s²."""
    s2 = 1.0 + n_eff * g
    log_k = 2.0 / (nu + 1) * (0.5 * math.log(s2) - math.log(alpha))
    k = math.exp(log_k)
    if k >= s2:
        return math.inf
    return math.sqrt(nu * math.expm1(log_k) / (1.0 - k / s2))


@dataclass(frozen=True)
class BaseLook:
    """What every look of either test records first: its number, the run ``record_id`` of ``model`` it came
    after, the runs of A and B, ``diff`` = mean_A - mean_B in the metric's direction, an sd and diff's se."""

    look: int
    record_id: int | None
    model: str
    n_a: int
    n_b: int
    diff: float
    sd: float
    se: float

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Look(BaseLook):
    """One look of the anytime test (``BaseLook``'s fields, sd pooled), then the sequence, the e-value at 0, the
    decision.

    ``ci_low``/``ci_high`` the confidence sequence (None when unbounded); ``boundary`` is c (None when
    infinite); ``more_runs`` per model (continue only).
    """

    boundary: float | None
    ci_low: float | None
    ci_high: float | None
    e_value: float
    decision: str
    more_runs: int | None


@dataclass(frozen=True)
class SequentialDecision:
    """The decision after the last look (or the first stop) and every look before it.

    Args:
        decision (str): ``stop_better``, ``stop_worse``, ``stop_futile``, ``inconclusive`` or ``continue``.
        reason (str): why, in words.
        looks (tuple[Look, ...] | tuple[PlannedLook, ...]): in recording order, up to the first stop.
        runs (tuple[int, int]): runs of A and B used (within the plan's maximum, up to the stop).
        after_stop (int): runs recorded after the stop (not looked at).
        beyond_max (int): runs past a model's maximum (not looks).
        more_runs (int | None): for ``continue``, the runs per model that would decide at the current estimates
            (None: more than the plan allows, or no look yet).
    """

    decision: str
    reason: str
    looks: tuple[Look, ...] | tuple[PlannedLook, ...]
    runs: tuple[int, int]
    after_stop: int
    beyond_max: int
    more_runs: int | None

    @property
    def last(self) -> Look | PlannedLook | None:
        return self.looks[-1] if self.looks else None

    def to_dict(self, replay: bool = True) -> dict:
        out = {"decision": self.decision, "reason": self.reason, "runs": list(self.runs),
               "after_stop": self.after_stop, "beyond_max": self.beyond_max, "more_runs": self.more_runs,
               "last": self.last.to_dict() if self.last else None}
        if replay:
            out["looks"] = [x.to_dict() for x in self.looks]
        return out


@dataclass
class RunTally:
    """The runs of A and B a test has counted (``add_run`` per model) and those it passed over, in recording order.

    A run is passed over after the first stop (``after``) or past its model's ``max_runs`` (``beyond``).

    Args:
        a, b (str): the names. max_runs (int): N. sign (float): +1, or -1 when lower is better.
        test (str): the test's name, for errors. stopped (str | None): the first stop's reason, set by the test.
    """

    a: str
    b: str
    max_runs: int
    sign: float
    test: str
    stopped: str | None = None
    after: int = 0
    beyond: int = 0
    n: dict[str, int] = field(init=False)
    mean: dict[str, float] = field(init=False)
    ss: dict[str, float] = field(init=False)

    def __post_init__(self) -> None:
        self.n, self.mean, self.ss = {self.a: 0, self.b: 0}, {self.a: 0.0, self.b: 0.0}, {self.a: 0.0, self.b: 0.0}

    def take(self, run: Sequence) -> bool:
        """Count ``run`` (``(model, value[, record_id])``, value times ``sign``); False when it is passed over."""
        model, value = run[0], self.sign * float(run[1])
        if model not in self.n:
            raise EvidenceError(f"{self.test}: a run of {model!r}, not of {self.a} or {self.b}")
        if self.stopped:
            self.after += 1
            return False
        if self.n[model] >= self.max_runs:
            self.beyond += 1
            return False
        add_run(self.n, self.mean, self.ss, model, value)
        return True

    def decision(self, looks: tuple[Look, ...] | tuple[PlannedLook, ...], reason: str) -> SequentialDecision:
        """The decision: the last look's (``continue`` before any), with the counts of runs used and passed over."""
        return SequentialDecision(looks[-1].decision if looks else CONTINUE, reason, looks,
                                  (self.n[self.a], self.n[self.b]), self.after, self.beyond,
                                  None if self.stopped or not looks else looks[-1].more_runs)


def _width(na: int, nb: int, sd: float, g: float, alpha: float) -> tuple[float, float]:
    c = mixture_boundary(na + nb - 2, na * nb / (na + nb), g, alpha)
    se = sd * math.sqrt(1 / na + 1 / nb)
    return c, (math.inf if math.isinf(c) else c * se)


def _more_runs(na: int, nb: int, d: float, sd: float, min_effect: float, max_runs: int, g: float, alpha: float
               ) -> int | None:
    """The fewest k for which k more runs of each model (up to the maximum) would end the plan at the current
    d and s_p: half-width < max(d, D - d). None when the maximum comes first."""
    need = max(d, min_effect - d)
    for k in range(1, max_runs + 1):
        a, b = min(na + k, max_runs), min(nb + k, max_runs)
        if _width(a, b, sd, g, alpha)[1] < need:
            return k
        if (a, b) == (max_runs, max_runs):
            return None
    return None


def decide_runs(runs: Iterable[Sequence], *, a: str = "A", b: str = "B", min_effect: float, max_runs: int,
                alpha: float = 0.05, prior_scale: float = 1.0, higher_is_better: bool = True) -> SequentialDecision:
    """Apply the anytime-valid test (module docstring) after every run, in the order given.

    Args:
        runs (Iterable[Sequence]): ``(model, value)`` or ``(model, value, record_id)``, model ``a`` or ``b``.
        a, b (str): the names of A and B.
        min_effect (float): D > 0, in the metric's units and direction.
        max_runs (int): N, the most runs of each model that are looks.
        alpha (float): the error rate. prior_scale (float): sqrt(g). higher_is_better (bool): the direction.
    """
    if not (min_effect > 0 and 0 < alpha < 1 and prior_scale > 0 and max_runs >= 2):
        raise EvidenceError(f"sequential test: min_effect {min_effect!r} > 0, 0 < alpha {alpha!r} < 1, "
                            f"prior_scale {prior_scale!r} > 0 and max_runs {max_runs!r} >= 2 are needed")
    g = prior_scale**2
    tally = RunTally(a, b, max_runs, 1.0 if higher_is_better else -1.0, "sequential test")
    n, mean, ss = tally.n, tally.mean, tally.ss
    looks: list[Look] = []
    for run in runs:
        if not tally.take(run):
            continue
        model = run[0]
        na, nb = n[a], n[b]
        if na < 2 or nb < 2:
            continue
        d, sd = mean[a] - mean[b], math.sqrt(max(ss[a] + ss[b], 0.0) / (na + nb - 2))
        c, half = _width(na, nb, sd, g, alpha)
        se = sd * math.sqrt(1 / na + 1 / nb)
        t = d / se if se > 0 else (math.copysign(math.inf, d) if d else 0.0)
        e = mixture_e_value(t, na + nb - 2, na * nb / (na + nb), g)
        lo, hi = (None, None) if math.isinf(half) else (d - half, d + half)
        more = None
        if lo is not None and lo > 0:
            decision, tally.stopped = STOP_BETTER, f"the sequence's lower end {lo:.4g} > 0: {a} better than {b}"
        elif hi is not None and hi < 0:
            decision, tally.stopped = STOP_WORSE, f"the sequence's upper end {hi:.4g} < 0: {a} worse than {b}"
        elif hi is not None and hi < min_effect:
            decision, tally.stopped = STOP_FUTILE, (f"the sequence's upper end {hi:.4g} < D = {min_effect:g}: "
                                                    f"{a} is not better than {b} by D")
        elif na >= max_runs and nb >= max_runs:
            decision, tally.stopped = INCONCLUSIVE, f"both have the plan's {max_runs} runs: the budget is spent"
        else:
            decision = CONTINUE
            more = _more_runs(na, nb, d, sd, min_effect, max_runs, g, alpha)
        looks.append(Look(len(looks) + 1, run[2] if len(run) > 2 else None, model, na, nb, d, sd, se,
                          None if math.isinf(c) else c, lo, hi, e, decision, more))
    if tally.stopped:
        reason, last = tally.stopped, looks[-1]
    elif looks:
        last = looks[-1]
        reason = (f"the sequence [{last.ci_low:.4g}, {last.ci_high:.4g}] holds 0 and D = {min_effect:g}"
                  if last.ci_low is not None else "too few runs for the sequence to be bounded yet")
        reason += (f"; about {last.more_runs} more run(s) of each" if last.more_runs else
                   f"; more than the plan's {max_runs} runs each would be needed at these estimates")
    else:
        reason = f"no look yet: runs {a} {n[a]}, {b} {n[b]} (a look needs 2 of each after the plan)"
    return tally.decision(tuple(looks), reason)


def plan_runs(plan: Plan, records: Iterable[Record]) -> list[tuple[str, float, int]]:
    """The plan's looks, in recording order: whole runs of its metric by A or B that measured the weights it
    names (sha256 equal to the plan's), recorded after it (record id above ``after_record``) or, for a plan
    that counts the runs recorded before it (``design["existing"]``), at any time."""
    shas = {plan.a: plan.a_sha256, plan.b: plan.b_sha256}
    since = -1 if (plan.design or {}).get("existing") else plan.after_record
    return [(r.model, r.value, r.id) for r in sorted(records, key=lambda r: r.id)
            if not r.is_item and r.metric == plan.metric and r.model in shas and r.id > since
            and r.sha256 == shas[r.model]]


def check_plan_weights(p: Plan, current_sha: Mapping[str, str | None] | None) -> None:
    """Raise when A or B of plan ``p`` now has other weights than the plan names."""
    for name, planned in ((p.a, p.a_sha256), (p.b, p.b_sha256)):
        now = (current_sha or {}).get(name, planned)
        if now != planned:
            raise EvidenceError(f"plan {p.id}: {name} now has other weights (sha256 {str(now)[:12]}, the plan's "
                                f"{str(planned)[:12]}); record a new plan for these weights")


def plan_looks(p: Plan, records: Sequence[Record], env: EnvChoice | None) -> list[Record]:
    """The records that are plan ``p``'s looks, in one eval environment (several: refused, naming the fields)."""
    ids = {rid for _, _, rid in plan_runs(p, records)}
    looks = [r for r in records if r.id in ids]
    _, kept = one_environment(looks, env, f"plan {p.id} ({p.a} --vs {p.b} on {p.metric})")
    return kept
