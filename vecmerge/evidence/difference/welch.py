"""Welch's unequal-variance t test over whole runs (Evan Miller, "Adding Error Bars to Evals", 2024).

    Δ = x̄_A - x̄_B,  SE = sqrt(s_A²/n_A + s_B²/n_B),
    ν = SE⁴ / ((s_A²/n_A)²/(n_A-1) + (s_B²/n_B)²/(n_B-1)),  t = Δ/SE,  p = 2·P(T_ν > |t|)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .registry import RUNS, Scores, register
from .result import DiffResult, difference_test, mean_std


def welch_test(a: Sequence[float], b: Sequence[float], confidence: float = 0.95) -> DiffResult | None:
    """Welch's t comparison of two models' repeated runs (module docstring formulas).

    Args:
        a, b (Sequence[float]): the runs of A and of B.
    Returns None when either has fewer than 2 runs, or neither varies (SE = 0).
    """
    if len(a) < 2 or len(b) < 2:
        return None
    a, b = [float(x) for x in a], [float(x) for x in b]
    (ma, sa), (mb, sb) = mean_std(a), mean_std(b)
    if sa is None or sb is None:
        return None  # not reached: n >= 2 has a sample sd
    qa, qb = sa**2 / len(a), sb**2 / len(b)
    se2 = qa + qb
    df = se2**2 / (qa**2 / (len(a) - 1) + qb**2 / (len(b) - 1)) if se2 > 0 else 0.0
    return difference_test(Welch.name, ma - mb, math.sqrt(se2), df, (len(a), len(b)), confidence)


@register
@dataclass(frozen=True)
class Welch:
    name: str = "welch"
    summary: str = "Welch's t over whole runs (unequal variances)"
    needs: str = RUNS
    decides: int = 40
    shown: int = 10

    def run(self, scores: Scores, confidence: float) -> DiffResult | None:
        return welch_test(scores.runs_a, scores.runs_b, confidence)

    def size(self, result: Mapping) -> str:
        return f"{result['n'][0]} vs {result['n'][1]} runs"
