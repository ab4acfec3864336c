"""The ledger's typical run noise, and how many repeats a difference needs.

    pooled      s_p² = Σ_m (n_m - 1) s_m² / Σ_m (n_m - 1) over models with n_m ≥ 2 runs
    power       P(|T| > t_{1-α/2, 2n-2}) with T ~ noncentral t(2n - 2, δ / (σ·sqrt(2/n)))   (two-sample t)
    one-sided   P(T > t_{1-α, 2n-2}), the same T with δ signed (a non-inferiority test: δ = effect + margin)
    repeats     the fewest n with power ≥ the target (bisection: the power grows with n)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

from .. import EvidenceError
from .stats import summarize


@dataclass(frozen=True)
class PooledNoise:
    """The ledger's typical within-model noise on one metric: s_p over models with ≥ 2 runs."""

    sd: float
    var: float
    df: int
    models: tuple[str, ...]

    def to_dict(self) -> dict:
        return {**asdict(self), "models": list(self.models)}


def pooled_noise(runs: Mapping[str, Sequence[float]]) -> PooledNoise | None:
    """Pooled sample variance s_p² = Σ (n_m - 1) s_m² / Σ (n_m - 1) over models with n_m ≥ 2.

    Args:
        runs (Mapping[str, Sequence[float]]): model -> its run values on one metric.

    Returns:
        PooledNoise, or None when no model has two runs.
    """
    num, df, used = 0.0, 0, []
    for model, xs in runs.items():
        if len(xs) >= 2:
            s = summarize(xs)
            num += (s.n - 1) * s.sd**2
            df += s.n - 1
            used.append(model)
    if df == 0:
        return None
    return PooledNoise(math.sqrt(num / df), num / df, df, tuple(used))


def power_two_sample(n: int, delta: float, sd: float, alpha: float = 0.05, sides: int = 2) -> float:
    """Power of the two-sample t test with n runs per model, equal noise sd, true difference delta:

    two-sided (``sides=2``): P(|T| > t_{1-α/2, 2n-2}) with T ~ noncentral t(df = 2n - 2, ncp = |δ| / (σ·sqrt(2/n)));
    one-sided (``sides=1``, "the difference exceeds 0"): P(T > t_{1-α, 2n-2}), ncp = δ / (σ·sqrt(2/n)) signed.
    """
    from scipy import stats

    if sides not in (1, 2):
        raise EvidenceError(f"sides={sides!r}: 1 or 2")
    df = 2 * n - 2
    if sides == 1:
        return float(stats.nct.sf(stats.t.ppf(1 - alpha, df), df, delta / (sd * math.sqrt(2.0 / n))))
    ncp = abs(delta) / (sd * math.sqrt(2.0 / n))
    crit = stats.t.ppf(1 - alpha / 2, df)
    # P(T < -crit) as P(-T > crit), -T ~ noncentral t(df, -ncp): scipy's nct.cdf is nan that deep in the tail
    return float(stats.nct.sf(crit, df, ncp) + stats.nct.sf(crit, df, -ncp))


def repeats_needed(delta: float, sd: float, *, alpha: float = 0.05, power: float = 0.8,
                   max_n: int = 100_000, sides: int = 2) -> int | None:
    """The fewest runs per model (n ≥ 2) for which ``power_two_sample(n, delta, sd, alpha, sides) ≥ power``.

    Bisection over 2..max_n (the power grows with n), exact for the noncentral t. Returns None when delta
    is 0 (one-sided: not > 0) or more than ``max_n`` runs would be needed.
    """
    if not sd > 0:
        raise EvidenceError(f"sd={sd!r}: the noise must be > 0 to plan repeats")
    if delta == 0 or (sides == 1 and delta < 0) or max_n < 2 or power_two_sample(max_n, delta, sd, alpha,
                                                                                   sides) < power:
        return None
    short, enough = 1, max_n  # `short` runs fall short of the power (one run cannot be tested), `enough` reach it
    while enough - short > 1:
        mid = (short + enough) // 2
        if power_two_sample(mid, delta, sd, alpha, sides) >= power:
            enough = mid
        else:
            short = mid
    return enough
