"""The paired t test over the items both models scored (Miller 2024).

    d_i = ā_i - b̄_i (ā_i: the mean of A's records of item i),  Δ = d̄,  SE = s_d / sqrt(n),  ν = n - 1
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from .registry import ITEMS, Scores, register
from .result import DiffResult, difference_test, mean_std


def item_size(result: Mapping) -> str:
    """The report's n column of an item-level test: ``N items`` (and ``, C clusters``)."""
    return f"{result['n'][0]} items" + (f", {result['clusters']} clusters" if result["clusters"] else "")


@register
@dataclass(frozen=True)
class Paired:
    name: str = "paired"
    summary: str = "paired t over the items both models scored"
    needs: str = ITEMS
    decides: int = 20
    shown: int = 20

    def run(self, scores: Scores, confidence: float) -> DiffResult | None:
        common = scores.common()
        if not common:
            return None
        mean, std = mean_std([scores.items_a[i] - scores.items_b[i] for i in common])
        if std is None:
            return None  # not reached: common() holds >= 2 items
        n = len(common)
        return difference_test(self.name, mean, std / math.sqrt(n), n - 1, (n,), confidence)

    def size(self, result: Mapping) -> str:
        return item_size(result)
