"""The paired t test over the items both models scored (Miller 2024), with McNemar's p on 0/1 items.

    d_i = ā_i - b̄_i (ā_i: the mean of A's records of item i),  Δ = d̄,  SE = s_d / sqrt(n),  ν = n - 1
    0/1 items   n10 items only A got right, n01 only B; p is the exact two-sided binomial test of n10 of
                n10 + n01 at 1/2 when n10 + n01 < 25, else the chi-square (|n10 - n01| - 1)² / (n10 + n01)
                on 1 df; Δ, SE and the interval stay the paired t's; the verdict rests on p (``alpha``)
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from .registry import ITEMS, Scores, register
from .result import DiffResult, difference_test, mean_std

MCNEMAR_EXACT_BELOW = 25  # discordant pairs: below this many, the exact binomial test


def item_size(result: Mapping) -> str:
    """The report's n column of an item-level test: ``N items`` (and ``, C clusters``)."""
    return f"{result['n'][0]} items" + (f", {result['clusters']} clusters" if result["clusters"] else "")


def mcnemar(n10: int, n01: int, t_test: DiffResult | None, n: int, confidence: float) -> DiffResult:
    """McNemar's test of paired 0/1 items (module docstring): p exact binomial when n10 + n01 < 25, else the
    continuity-corrected chi-square; the paired t's difference, SE and interval (exact when every d_i is equal).

    Args:
        n10, n01 (int): items only A scored 1 on, only B. t_test: the paired t of the same items. n: items.
    """
    from scipy import stats

    m = n10 + n01
    if m == 0:
        p, method = 1.0, "McNemar (no item differs)"
    elif m < MCNEMAR_EXACT_BELOW:
        p, method = float(stats.binomtest(n10, m, 0.5).pvalue), "McNemar exact binomial"
    else:
        p, method = float(stats.chi2.sf((abs(n10 - n01) - 1) ** 2 / m, 1)), "McNemar chi-square"
    if t_test is None:  # every item differs the same way (or none differs): the difference is exact
        diff = (n10 - n01) / n
        return DiffResult(Paired.name, diff, 0.0, float(n - 1), math.copysign(math.inf, diff) if diff else 0.0, p,
                          diff, diff, (n,), None, method, (n10, n01), 1 - confidence)
    return DiffResult(Paired.name, t_test.diff, t_test.se, t_test.df, t_test.t, p, t_test.ci_low, t_test.ci_high,
                      (n,), None, method, (n10, n01), 1 - confidence)


@register
@dataclass(frozen=True)
class Paired:
    name: str = "paired"
    summary: str = "paired t over the items both models scored (McNemar's p when every item is 0 or 1)"
    needs: str = ITEMS
    decides: int = 20
    shown: int = 20

    def run(self, scores: Scores, confidence: float) -> DiffResult | None:
        common = scores.common()
        if not common:
            return None
        a, b = scores.items_a, scores.items_b
        d = [a[i] - b[i] for i in common]
        mean, std = mean_std(d)
        n = len(common)
        iid = difference_test(self.name, mean, std / math.sqrt(n), n - 1, (n,), confidence) if std is not None \
            else None
        if all(a[i] in (0.0, 1.0) and b[i] in (0.0, 1.0) for i in common):
            iid = mcnemar(sum(x > 0 for x in d), sum(x < 0 for x in d), iid, n, confidence)
        return iid

    def size(self, result: Mapping) -> str:
        return item_size(result)
