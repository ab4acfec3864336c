"""What a difference test returns (``DiffResult``), and the t machinery the t tests share.

    t test      t = diff / SE,  p = 2·P(T_df > |t|),  interval diff ± t_{(1+confidence)/2, df} · SE
    round-off   a sample sd s ≤ 4 n ε max|x_i| is the round-off of the mean, not spread: s = 0
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any


def _t() -> Any:  # scipy.stats.t (scipy has no type stubs)
    from scipy import stats

    return stats.t


def t_interval(mean: float, se: float, df: float, confidence: float = 0.95) -> tuple[float, float]:
    """``mean ± t_{(1+confidence)/2, df} · se``: a two-sided Student-t interval."""
    q = float(_t().ppf(0.5 + confidence / 2, df))
    return mean - q * se, mean + q * se


def round_off(values: Sequence[float]) -> float:
    """``4 n ε max|x_i|``: a spread this small is the float round-off of a mean of ``values``, not noise."""
    return 4 * len(values) * sys.float_info.epsilon * max((abs(x) for x in values), default=0.0)


def mean_std(values: Sequence[float]) -> tuple[float, float | None]:
    """x̄ = Σ x_i / n and the sample sd s = sqrt(Σ (x_i - x̄)² / (n - 1)) (None for n = 1; 0 within
    ``round_off``), by ``math.fsum``.

    Args:
        values (Sequence[float]): n ≥ 1 values.
    """
    n = len(values)
    mean = math.fsum(values) / n
    if n < 2:
        return mean, None
    std = math.sqrt(math.fsum((x - mean) ** 2 for x in values) / (n - 1))
    return mean, 0.0 if std <= round_off(values) else std


@dataclass(frozen=True)
class DiffResult:
    """A difference A - B with its standard error, statistic, p-value and interval.

    kind: the registered test's name (``difference.names()``), or ``trainings`` (``stats.replicates``).
    n: what the test counted (runs of A and B, or items); clusters: the cluster count, where it has one.
    method: how p was computed when not from t (e.g. ``McNemar exact binomial``); discordant: (n10, n01) of
    0/1 items; alpha: set when the verdict rests on ``p < alpha``, not on the interval.
    """

    kind: str
    diff: float
    se: float
    df: float
    t: float
    p: float
    ci_low: float
    ci_high: float
    n: tuple[int, ...]
    clusters: int | None = None
    method: str = "t"
    discordant: tuple[int, int] | None = None
    alpha: float | None = None

    @property
    def beyond_noise(self) -> bool:
        """True when the interval excludes 0 (equivalently p < 1 - confidence); with ``alpha``: when p < alpha."""
        if self.alpha is not None:
            return self.p < self.alpha
        return self.ci_low > 0 or self.ci_high < 0

    def to_dict(self) -> dict:
        return {**asdict(self), "n": list(self.n), "beyond_noise": self.beyond_noise,
                "discordant": None if self.discordant is None else list(self.discordant)}


def difference_test(kind: str, diff: float, se: float, df: float, n: tuple[int, ...], confidence: float,
                    clusters: int | None = None) -> DiffResult | None:
    """The t test of a difference ``diff`` with standard error ``se`` on ``df`` degrees of freedom:
    t = diff / se, p = 2·P(T_df > |t|), the interval ``t_interval(diff, se, df, confidence)``; None when
    ``se`` or ``df`` is not > 0 (no spread: noise cannot be estimated)."""
    if not se > 0 or not df > 0:
        return None  # no spread: noise cannot be estimated from these values
    t = diff / se
    p = float(2 * _t().sf(abs(t), df))
    lo, hi = t_interval(diff, se, df, confidence)
    return DiffResult(kind, diff, se, float(df), t, p, lo, hi, tuple(n), clusters)
