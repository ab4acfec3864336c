"""What a plan can do before a run is spent: its power, expected runs and the fixed-n runs for the same power.

Seeded Monte Carlo of the plan's own decision rule (``planned.py``: the same looks, boundaries and Welch t) over
normal runs with the plan's noise sd: A ~ N(Δ, sd), B ~ N(0, sd), the runs recorded before the plan first
(``--use-existing``), then the model with fewer runs next (A on ties). With S simulations a power p has Monte
Carlo standard error sqrt(p (1 - p) / S) (S = ``SIMS``: at most 0.0035).

    power(Δ)      P(stop_better | Δ), at Δ = D and 2D
    expected runs  the mean runs (both models, those before the plan included) to the stop, at Δ = D and 0
    fixed-n runs   the fewest n per model whose fixed-n two-sided t test (pooled, 2n - 2 df, noncentrality
                   (Δ/sd) sqrt(n/2), scipy's nct) has at least the plan's power at D
    runs for 80%   (power at D below 80%) the fewest N per model, in steps of about 5%, that reach 80% by the
                   same simulation (``SEARCH_SIMS`` draws)
A warning is stated when the power at D is below 50%.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
from scipy import stats

from .group_sequential import Spending
from .planned import Design, is_look
from .sequential import STOP_BETTER, decide_runs

SIMS = 20_000
SEARCH_SIMS = 4_000
ANYTIME_SIMS = 1_000
SEED = 20261206
MAX_SEARCH = 500  # runs per model beyond which the 80% search stops
MAX_SIMULATED = 1_000  # runs per model beyond which no power is simulated (said so)
DRAWS = 2_000_000  # simulations x runs per model at most in one simulation (memory)


@dataclass(frozen=True)
class PlanPower:
    """A planned-looks plan's operating figures at the plan's noise sd (module docstring); None: not known.

    Args:
        sd (float | None): the run noise sd used. power_d, power_2d (float | None): P(stop_better) at D, 2D.
        expected_runs_d, expected_runs_0 (float | None): mean runs of both models to the stop at Δ = D, 0.
        fixed_n (int | None): runs per model of a fixed-n t test with the same power at D.
        n_for_80 (int | None): runs per model that reach 80% at D (None: reached already, or unknown).
        sims (int): simulations per figure. warning (str | None): below 50% power, or no sd.
    """

    sd: float | None
    power_d: float | None
    power_2d: float | None
    expected_runs_d: float | None
    expected_runs_0: float | None
    fixed_n: int | None
    n_for_80: int | None
    sims: int
    warning: str | None

    def to_dict(self) -> dict:
        return asdict(self)


def schedule(max_runs: int, existing: tuple[int, int] | None, look_every: int) -> tuple[list[int], list[tuple]]:
    """The assumed run order (0: A, 1: B) and its looks ``(run index, n_A, n_B, fraction)``."""
    na, nb = existing or (0, 0)
    order = [0] * na + [1] * nb
    while na < max_runs or nb < max_runs:
        if na <= nb and na < max_runs or nb >= max_runs:
            order.append(0)
            na += 1
        else:
            order.append(1)
            nb += 1
    leading = sum(existing) if existing else 0
    looks, n, since = [], [0, 0], 0
    for i, m in enumerate(order):
        n[m] += 1
        since += 1
        if is_look(i, n[0], n[1], since, leading=leading, look_every=look_every, max_runs=max_runs):
            since = 0
            full = n[0] >= max_runs and n[1] >= max_runs
            looks.append((i, n[0], n[1], 1.0 if full else min(n[0] * n[1] / (n[0] + n[1]) / (max_runs / 2), 1.0)))
    return order, looks


def simulate(effect: float, min_effect: float, max_runs: int, alpha: float, design: Design, *, sims: int = SIMS,
             seed: int = SEED) -> tuple[float, float]:
    """(P(stop_better), mean runs to the stop) at a true difference ``effect`` (in sd units, D likewise).

    Args:
        effect (float): Δ / sd. min_effect (float): D / sd. max_runs (int): N. alpha (float): two-sided.
        design (Design): the plan's design. sims (int), seed (int): the simulation.
    """
    order, looks = schedule(max_runs, design.existing, design.look_every)
    upper = Spending(alpha / 2, design.spending)
    futile = Spending(design.beta, design.spending) if design.beta > 0 else None
    sims = max(200, min(sims, DRAWS // max_runs))
    rng = np.random.default_rng(seed)
    xa, xb = rng.normal(effect, 1.0, (sims, max_runs)), rng.normal(0.0, 1.0, (sims, max_runs))
    sa, sb, qa, qb = (np.cumsum(x, axis=1) for x in (xa, xb, xa * xa, xb * xb))
    alive, better, used = np.ones(sims, bool), np.zeros(sims, bool), np.full(sims, float(len(order)))
    for i, na, nb, fraction in looks:
        ma, mb = sa[:, na - 1] / na, sb[:, nb - 1] / nb
        va = np.maximum(qa[:, na - 1] - na * ma * ma, 0.0) / (na - 1) / na
        vb = np.maximum(qb[:, nb - 1] - nb * mb * mb, 0.0) / (nb - 1) / nb
        se = np.sqrt(va + vb)
        df = (va + vb) ** 2 / (va * va / (na - 1) + vb * vb / (nb - 1))
        zu = upper.add(fraction)
        c = np.full(sims, np.inf) if math.isinf(zu) else stats.t.isf(stats.norm.sf(zu), df)
        zf = futile.add(fraction) if futile else math.inf
        f = np.full(sims, np.inf) if math.isinf(zf) else stats.t.isf(stats.norm.sf(zf), df)
        t, w = (ma - mb) / se, (ma - mb - min_effect) / se
        up = alive & (t >= c)
        stop = up | (alive & ((t <= -c) | (w <= -f)))
        if na >= max_runs and nb >= max_runs:
            stop = alive.copy()
        better |= up
        used[stop] = i + 1
        alive &= ~stop
    return float(better.mean()), float(used.mean())


def fixed_n_power(n: int, effect: float, alpha: float) -> float:
    """Two-sided pooled t test power with n runs per model at Δ / sd = ``effect`` (noncentral t, 2n - 2 df)."""
    df, nc = 2 * n - 2, effect * math.sqrt(n / 2)
    crit = stats.t.isf(alpha / 2, df)
    return float(stats.nct.sf(crit, df, nc) + stats.nct.cdf(-crit, df, nc))


def fixed_n_runs(power: float, effect: float, alpha: float, cap: int = 100_000) -> int | None:
    """The fewest n >= 2 per model whose fixed-n power at ``effect`` reaches ``power`` (None past ``cap``)."""
    lo, hi = 2, 2
    while fixed_n_power(hi, effect, alpha) < power:
        lo, hi = hi, hi * 2
        if hi > cap:
            return None
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (mid + 1, hi) if fixed_n_power(mid, effect, alpha) < power else (lo, mid)
    return lo


def plan_power(min_effect: float, max_runs: int, alpha: float, design: Design, sd: float | None) -> PlanPower:
    """The figures of module docstring for a planned-looks plan at noise ``sd`` (None or 0: unknown).

    Args:
        min_effect (float): D. max_runs (int): N. alpha (float): two-sided. design (Design). sd (float | None).
    """
    if not sd or not sd > 0:
        return PlanPower(None, None, None, None, None, None, None, 0,
                         "no run noise recorded: the plan's power is unknown; give --noise-sd SD (a run-to-run sd "
                         "of this metric) to see it before a run is spent")
    if max_runs > MAX_SIMULATED:
        return PlanPower(sd, None, None, None, None, None, None, 0,
                         f"power not simulated past {MAX_SIMULATED} runs of each (--max-runs {max_runs})")
    d = min_effect / sd
    power_d, runs_d = simulate(d, d, max_runs, alpha, design)
    power_2d, _ = simulate(2 * d, d, max_runs, alpha, design)
    _, runs_0 = simulate(0.0, d, max_runs, alpha, design)
    n80 = None
    if power_d < 0.8:
        n = max(max_runs + 1, fixed_n_runs(0.8, d, alpha) or MAX_SEARCH)
        while n <= MAX_SEARCH:
            grown = Design(design.spending, design.look_every, design.beta, design.existing)
            if simulate(d, d, n, alpha, grown, sims=SEARCH_SIMS)[0] >= 0.8:
                n80 = n
                break
            n = n + max(1, n // 20)
    warning = None
    if power_d < 0.5:
        reach = f"about {n80} runs of each reach 80%" if n80 else f"more than {MAX_SEARCH} runs of each for 80%"
        warning = (f"power {power_d:.0%} at D = {min_effect:g} (sd {sd:.3g}): a plan of {max_runs} runs of each "
                   f"will rarely say stop_better; {reach}")
    return PlanPower(sd, power_d, power_2d, runs_d, runs_0, fixed_n_runs(power_d, d, alpha), n80,
                     max(200, min(SIMS, DRAWS // max_runs)), warning)


def anytime_power(min_effect: float, max_runs: int, alpha: float, sd: float | None,
                  existing: tuple[int, int] | None = None) -> PlanPower:
    """Power at D and 2D of the anytime mixture (``sequential.decide_runs``, prior scale D / sd, a look after every
    run) by ``ANYTIME_SIMS`` seeded simulations of it; no 80% search (its power grows slowly with N)."""
    if not sd or not sd > 0 or max_runs > MAX_SIMULATED // 10:
        why = "without a run noise sd (give --noise-sd)" if not sd else f"past {MAX_SIMULATED // 10} runs of each"
        return PlanPower(sd or None, None, None, None, None, None, None, 0, f"the plan's power is not simulated {why}")
    d, rng, rates = min_effect / sd, np.random.default_rng(SEED), []
    for effect in (d, 2 * d):
        hits = 0
        for _ in range(ANYTIME_SIMS):
            xa, xb = rng.normal(effect, 1.0, max_runs), rng.normal(0.0, 1.0, max_runs)
            runs = [run for pair in zip((("A", x) for x in xa), (("B", y) for y in xb)) for run in pair]
            decision = decide_runs(runs, min_effect=d, max_runs=max_runs, alpha=alpha, prior_scale=d).decision
            hits += decision == STOP_BETTER
        rates.append(hits / ANYTIME_SIMS)
    warning = None if rates[0] >= 0.5 else (
        f"power {rates[0]:.0%} at D = {min_effect:g} (sd {sd:.3g}): an anytime plan of {max_runs} runs of each will "
        f"rarely say stop_better; a planned-looks plan (--kind group-sequential) has more power")
    return PlanPower(sd, rates[0], rates[1], None, None, fixed_n_runs(rates[0], d, alpha), None, ANYTIME_SIMS, warning)
