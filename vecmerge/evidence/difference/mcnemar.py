"""McNemar's exact test for paired 0/1 items: both models scored the same items, each item 0 or 1.

    b = #items A got right and B wrong,  c = #items B got right and A wrong,  n = #items both scored
    p = min(1, 2 · BinomCDF(min(b, c); b + c, 1/2))                     (exact, conditional on b + c)
    Δ = (b - c) / n,  interval (b + c)/n · (2π - 1) over π in the Clopper-Pearson interval of b / (b + c)
    SE = sqrt(b + c) / n (under the null, given b + c),  statistic z = Δ / SE = (b - c) / sqrt(b + c),  df = b + c

The interval is the exact conditional one (the discordant share (b + c)/n held at its observed value): it
excludes 0 exactly when p < 1 - confidence, so the verdict and the p-value agree. No discordant item
(b + c = 0): no test (None), as the paired t gives none without spread.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from .registry import BINARY_ITEMS, Scores, register
from .result import DiffResult


def mcnemar_test(b: int, c: int, n: int, confidence: float = 0.95) -> DiffResult | None:
    """McNemar's exact test from the discordant counts (module docstring formulas).

    Args:
        b (int): items A scored 1 and B 0. c (int): items A scored 0 and B 1. n (int): items both scored.
        confidence (float): the interval's coverage.
    """
    m = b + c
    if m == 0:
        return None
    from scipy import stats

    p = min(1.0, float(2 * stats.binom.cdf(min(b, c), m, 0.5)))
    tail = (1 - confidence) / 2
    lo = float(stats.beta.ppf(tail, b, c + 1)) if b > 0 else 0.0
    hi = float(stats.beta.ppf(1 - tail, b + 1, c)) if c > 0 else 1.0
    share = m / n
    se = math.sqrt(m) / n  # > 0 whenever there is a test (the Wald SE is 0 when every item is discordant one way)
    return DiffResult(McNemar.name, (b - c) / n, se, float(m), (b - c) / math.sqrt(m), p, share * (2 * lo - 1),
                      share * (2 * hi - 1), (n,), None, "exact binomial", (b, c))


@register
@dataclass(frozen=True)
class McNemar:
    name: str = "mcnemar"
    summary: str = "McNemar's exact test over paired 0/1 items"
    needs: str = BINARY_ITEMS
    decides: int = 30
    shown: int = 40

    def run(self, scores: Scores, confidence: float) -> DiffResult | None:
        common = scores.common()
        pairs = [(scores.items_a[i], scores.items_b[i]) for i in common]
        if not pairs or any(x not in (0.0, 1.0) or y not in (0.0, 1.0) for x, y in pairs):
            return None
        b = sum(1 for x, y in pairs if x > y)
        c = sum(1 for x, y in pairs if x < y)
        return mcnemar_test(b, c, len(pairs), confidence)

    def size(self, result: Mapping) -> str:
        return f"{result['n'][0]} items"
