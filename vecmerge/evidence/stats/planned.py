"""Planned looks with power (the default plan): a group-sequential Welch test over the plan's looks.

A look comes once both models have 2 runs and ``look_every`` runs arrived since the last, and always at N each.
At a look (direction applied, Δ = mu_A - mu_B):

    d = mean_A - mean_B,  se² = s_A²/n_A + s_B²/n_B,  ν = Welch-Satterthwaite,  t = d / se,  w = (d - D) / se
    f = n_e / (N/2),  n_e = n_A n_B / (n_A + n_B);   efficacy c_k = F_ν⁻¹(Φ(b_k)),  b_k from Spending(alpha/2)

Futility: the same spending at level beta for the test of Δ >= D (non-binding). The decisions:
``decide_planned``. Assumes normal runs and a run order independent of the scores; approximate through ν
(measured in docs/DECISIONS.md). Sources and the look rule in full: docs/design/evidence.md.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from scipy import special

from .. import EvidenceError
from ..difference.group_sequential import GROUP_SEQUENTIAL
from ..ledger.records import Plan, Record
from .group_sequential import SPENDING, boundary
from .sequential import (
    CONTINUE,
    INCONCLUSIVE,
    STOP_BETTER,
    STOP_FUTILE,
    STOP_WORSE,
    BaseLook,
    RunTally,
    SequentialDecision,
    decide_runs,
    plan_runs,
)

TEST = GROUP_SEQUENTIAL.name
_ZERO = 1e-12  # a spread below this share of the means' size is round-off: no run-to-run variation


@dataclass(frozen=True)
class Design:
    """How a planned-looks plan looks: spending family, looks every k runs, futility beta, existing runs.

    Args:
        spending (str): ``obf`` (O'Brien-Fleming-like, default) or ``pocock``.
        look_every (int): k >= 1, runs between looks.
        beta (float): the futility level (0: no futility stop), 0 <= beta < 1.
        existing (tuple[int, int] | None): runs of A and B recorded before the plan that are its first look
            (``--use-existing``), None when they are not counted.
    """

    spending: str = "obf"
    look_every: int = 1
    beta: float = 0.1
    existing: tuple[int, int] | None = None

    def problems(self) -> list[str]:
        out = []
        if self.spending not in SPENDING:
            out.append(f"spending: {self.spending!r} is not one of {', '.join(SPENDING)}")
        if isinstance(self.look_every, bool) or not isinstance(self.look_every, int) or self.look_every < 1:
            out.append(f"look_every: {self.look_every!r} must be an integer >= 1")
        if isinstance(self.beta, bool) or not isinstance(self.beta, (int, float)) or not 0 <= self.beta < 1:
            out.append(f"beta: {self.beta!r} must be a number in [0, 1)")
        if self.existing is not None and not (
                len(self.existing) == 2 and all(isinstance(n, int) and not isinstance(n, bool) and n >= 0
                                                for n in self.existing)):
            out.append(f"existing: {self.existing!r} must be two run counts")
        return out


@dataclass(frozen=True)
class PlannedLook(BaseLook):
    """One look (``BaseLook``'s fields: runs, Welch's d, sd and se), then ν and t, the fraction, the t boundaries,
    and the decision.

    ``better_at`` is c_k (t >= c_k: better; t <= -c_k: worse; None: no stop possible at this look);
    ``futile_below`` the difference d under which the look says stop_futile (None: no futility stop here).
    """

    df: float
    t: float
    fraction: float
    better_at: float | None
    futile_below: float | None
    decision: str
    more_runs: int | None = None


def welch(na: int, nb: int, mean_a: float, mean_b: float, ss_a: float, ss_b: float) -> tuple[float, float, float]:
    """(d, se, ν): se² = s_A²/n_A + s_B²/n_B, ν = se⁴ / ((s_A²/n_A)²/(n_A-1) + (s_B²/n_B)²/(n_B-1));
    ν = n_A + n_B - 2 when both spreads are zero (se = 0)."""
    va, vb = max(ss_a, 0.0) / (na - 1) / na, max(ss_b, 0.0) / (nb - 1) / nb
    se2 = va + vb
    scale = max(abs(mean_a), abs(mean_b), 1.0) * _ZERO
    if math.sqrt(se2) <= scale:
        return mean_a - mean_b, 0.0, float(na + nb - 2)
    return mean_a - mean_b, math.sqrt(se2), se2 * se2 / (va * va / (na - 1) + vb * vb / (nb - 1))


def t_bound(z_bound: float, df: float) -> float:
    """The t boundary with the z boundary's nominal one-sided p: F_ν⁻¹(Φ(b)) (``inf`` stays ``inf``)."""
    return math.inf if math.isinf(z_bound) else float(-special.stdtrit(df, special.ndtr(-z_bound)))


def is_look(i: int, na: int, nb: int, since: int, *, leading: int, look_every: int, max_runs: int) -> bool:
    """Whether the counted run number ``i`` (0-based, ``since`` counted runs after the last look, this one
    included) is a look: both models have 2 runs, not among the ``leading`` runs recorded before the plan
    except their last, and ``look_every`` runs since the last look, or the last leading run, or both at N."""
    if na < 2 or nb < 2 or i < leading - 1:
        return False
    return since >= look_every or i == leading - 1 or (na >= max_runs and nb >= max_runs)


def _ratio(x: float, se: float) -> float:
    if se > 0:
        return x / se
    return math.copysign(math.inf, x) if x else 0.0


def decide_planned(runs: Iterable[Sequence], *, a: str = "A", b: str = "B", min_effect: float, max_runs: int,
                   alpha: float = 0.05, higher_is_better: bool = True, design: Design = Design(),
                   leading: int = 0) -> SequentialDecision:
    """Apply the planned-looks test (module docstring) to runs in recording order; at each look, the first of

        stop_better   t >= c_k: A better (wrong with probability <= alpha/2 when Δ <= 0)
        stop_worse    t <= -c_k: A worse (wrong with probability <= alpha/2 when Δ >= 0)
        stop_futile   w <= -F_ν⁻¹(Φ(F_k)): A is not better by D (said with probability <= beta when Δ >= D)
        inconclusive  both have N runs, no boundary crossed: the budget is spent
        continue      otherwise

    The first stop is final; later runs are counted, not looked at; runs past a model's N are not looks.

    Args:
        runs (Iterable[Sequence]): ``(model, value)`` or ``(model, value, record_id)``, model ``a`` or ``b``.
        a, b (str): the names. min_effect (float): D > 0. max_runs (int): N >= 2. alpha (float): two-sided level.
        higher_is_better (bool): the direction. design (Design): spending, look_every, beta.
        leading (int): the first ``leading`` runs were recorded before the plan (``--use-existing``): one look
            after them (when both have 2), none among them.
    """
    if not (min_effect > 0 and 0 < alpha < 1 and max_runs >= 2) or design.problems():
        raise EvidenceError(f"planned looks: min_effect {min_effect!r} > 0, 0 < alpha {alpha!r} < 1, max_runs "
                            f"{max_runs!r} >= 2 and a valid design are needed ({'; '.join(design.problems())})")
    tally = RunTally(a, b, max_runs, 1.0 if higher_is_better else -1.0, "planned looks")
    n, mean, ss = tally.n, tally.mean, tally.ss
    fractions: list[float] = []
    looks: list[PlannedLook] = []
    since, counted, zero = 0, 0, False
    for run in runs:
        if not tally.take(run):
            continue
        model = run[0]
        since, counted = since + 1, counted + 1
        na, nb = n[a], n[b]
        full = na >= max_runs and nb >= max_runs
        if not is_look(counted - 1, na, nb, since, leading=leading, look_every=design.look_every, max_runs=max_runs):
            continue
        since = 0
        d, se, df = welch(na, nb, mean[a], mean[b], ss[a], ss[b])
        zero = zero or se == 0.0
        fraction = 1.0 if full else min(na * nb / (na + nb) / (max_runs / 2), 1.0)
        if fractions and fraction <= fractions[-1]:
            continue  # no new information (cannot happen with a new counted run; kept for safety)
        fractions.append(fraction)
        c = t_bound(boundary(alpha / 2, design.spending, tuple(fractions)), df)
        f = t_bound(boundary(design.beta, design.spending, tuple(fractions)), df) if design.beta > 0 else math.inf
        t, w = _ratio(d, se), _ratio(d - min_effect, se)
        futile_below = None if math.isinf(f) else min_effect - f * se
        if t >= c:
            decision, tally.stopped = STOP_BETTER, (f"t {t:.3g} >= {c:.3g} at look {len(looks) + 1}: {a} better "
                                                    f"than {b}")
        elif t <= -c:
            decision, tally.stopped = STOP_WORSE, (f"t {t:.3g} <= -{c:.3g} at look {len(looks) + 1}: {a} worse "
                                                   f"than {b}")
        elif w <= -f:
            decision, tally.stopped = STOP_FUTILE, (
                f"diff {d:+.4g} <= {futile_below:.4g}: {a} is not better than {b} by D = {min_effect:g} (said with "
                f"probability <= beta {design.beta:g} when it is)")
        elif full:
            decision, tally.stopped = INCONCLUSIVE, (
                f"both have the plan's {max_runs} runs and no boundary was crossed (diff {d:+.4g}, t {t:.3g}, "
                f"needed {c:.3g}): the budget is spent")
        else:
            decision = CONTINUE
        looks.append(PlannedLook(len(looks) + 1, run[2] if len(run) > 2 else None, model, na, nb, d,
                                 se * math.sqrt(na * nb / (na + nb)), se, df, t, fraction,
                                 None if math.isinf(c) else c, futile_below, decision,
                                 None if decision != CONTINUE else max_runs - min(na, nb)))
    if tally.stopped:
        reason = tally.stopped
    elif looks:
        last = looks[-1]
        reason = (f"no boundary crossed at look {last.look} (t {last.t:.3g}" +
                  (f", needed ±{last.better_at:.3g}" if last.better_at else "") +
                  f"); up to {last.more_runs} more run(s) of each in the plan")
    else:
        reason = f"no look yet: runs {a} {n[a]}, {b} {n[b]} (a look needs 2 of each)"
    if zero:
        reason += "; assuming the metric does not vary between runs of one model (zero spread)"
    return tally.decision(tuple(looks), reason)


def design_of(plan: Plan) -> Design:
    """The plan's stored design (``Plan.design``) as a ``Design``."""
    d = plan.design or {}
    existing = d.get("existing")
    return Design(d.get("spending", "obf"), d.get("look_every", 1), d.get("beta", 0.1),
                  None if existing is None else tuple(existing))


def decide_plan(plan: Plan, records: Iterable[Record]) -> SequentialDecision:
    """The plan's decision over its looks: ``decide_planned`` for a group-sequential plan, ``decide_runs`` (the
    anytime mixture) for a t-mixture plan; runs recorded before the plan lead where the plan counts them."""
    runs = plan_runs(plan, records)
    if plan.test != TEST:
        return decide_runs(runs, a=plan.a, b=plan.b, min_effect=plan.min_effect, max_runs=plan.max_runs,
                           alpha=plan.alpha, prior_scale=plan.prior_scale, higher_is_better=plan.higher_is_better)
    design = design_of(plan)
    leading = sum(1 for r in runs if r[2] <= plan.after_record)
    return decide_planned(runs, a=plan.a, b=plan.b, min_effect=plan.min_effect, max_runs=plan.max_runs,
                          alpha=plan.alpha, higher_is_better=plan.higher_is_better, design=design, leading=leading)
