"""The paired test with Miller's clustered standard error (Miller 2024, "clustered standard errors").

    SE_C² = SE_CLT² + (1/n²) Σ_c Σ_{i∈c} Σ_{j∈c, j≠i} (d_i - d̄)(d_j - d̄),  SE_CLT² = s_d²/n,  ν = C - 1

An item without a cluster key is its own cluster, so with no clusters SE_C is the paired SE exactly. The
formula is the paper's (arXiv 2411.00640, as quoted; its PDF was not reachable from here).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass

from .paired import item_size
from .registry import CLUSTERS, Scores, register
from .result import DiffResult, difference_test


def clustered_se(d: Sequence[float], clusters: Sequence[Hashable]) -> float:
    """Miller's clustered standard error of the mean of ``d``:

    SE_C² = s²/n + (1/n²) Σ_c Σ_{i≠j ∈ c} (d_i - d̄)(d_j - d̄)
          = s²/n + (1/n²) (Σ_c (Σ_{i∈c} (d_i - d̄))² - Σ_i (d_i - d̄)²),   s² the sample variance (ddof=1).

    Args:
        d (Sequence[float]): per-item values (n ≥ 2).
        clusters (Sequence): the cluster key of each item (n).
    """
    n = len(d)
    mean = math.fsum(d) / n
    sums: dict = {}
    for x, c in zip(d, clusters):
        sums[c] = sums.get(c, 0.0) + (x - mean)
    squares = math.fsum((x - mean) ** 2 for x in d)
    cross = math.fsum(s * s for s in sums.values()) - squares
    return math.sqrt(max(squares / (n - 1) / n + cross / n**2, 0.0))


@register
@dataclass(frozen=True)
class Clustered:
    name: str = "clustered"
    summary: str = "paired t with clustered standard errors (items with a cluster key, >= 2 clusters)"
    needs: str = CLUSTERS
    decides: int = 10
    shown: int = 30

    def run(self, scores: Scores, confidence: float) -> DiffResult | None:
        common, clusters = scores.common(), scores.clusters
        if not common or not clusters or not any(i in clusters for i in common):
            return None
        keys = [("cluster", clusters[i]) if i in clusters else ("item", i) for i in common]
        count = len(set(keys))
        if count < 2:
            return None
        d = [scores.items_a[i] - scores.items_b[i] for i in common]
        n = len(d)
        return difference_test(self.name, math.fsum(d) / n, clustered_se(d, keys), count - 1, (n,), confidence,
                               count)

    def size(self, result: Mapping) -> str:
        return item_size(result)
