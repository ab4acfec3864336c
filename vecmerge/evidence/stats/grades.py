"""Discrete grades: do a score's recorded values lie on a grid, and what is its step? Only when the data show it.

Over the distinct values u_1 < ... < u_d (values within ``tol`` are one value), with p = 10^-decimals the
precision the values were WRITTEN with (``precision.py``, or ``--decimals``; unknown: no grade):

    tol = max(p / 2, 4 float epsilons)
    step = g_min / j, j = 1 .. max_divisor (largest first; at least ``min_ratio`` precisions)
    k_i = round((u_i - u_1) / step);  least squares u_i = c + step * k_i;  accepted when every |residual| <= tol,
    at least ``min_distinct`` grades occur and ``min_occupancy`` of the grades from u_1 to u_d are seen

``multiples``: whether c is itself a whole number of steps. A difference below one grade says only that no
grade moved. The user's grid and the measured false-grid rate: docs/design/evidence.md.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Grid:
    """A grid the values lie on: ``c + step * k`` for whole k (see the module docstring).

    Args:
        step (float): one grade (least squares).
        low (float): the fitted value of the lowest grade seen (``c``).
        levels (tuple[float, ...]): the distinct values seen, ascending.
        grades (tuple[int, ...]): each level's grade index above the lowest.
        occupancy (float): levels seen / grades from the lowest to the highest.
        multiples (bool): c is a whole number of steps: the grades are multiples of the step.
        max_residual (float): the largest |u_i - (c + step k_i)|.
        tolerance (float): ``tol``, the rounding half-unit of the values.
    """

    step: float
    low: float
    levels: tuple[float, ...]
    grades: tuple[int, ...]
    occupancy: float
    multiples: bool
    max_residual: float
    tolerance: float

    def in_grades(self, diff: float) -> float:
        """``diff / step``: a difference counted in grades."""
        return diff / self.step

    def below_one_grade(self, diff: float) -> bool:
        """True when |diff| is less than one grade (by more than the values' rounding, 2 tol)."""
        return abs(diff) < self.step - 2 * self.tolerance

    def to_dict(self) -> dict:
        return {**asdict(self), "levels": list(self.levels), "grades": list(self.grades)}


MIN_RATIO = 10  # a step must be this many precisions: a step of a few units of the last decimal is rounding


def value_tolerance(values: Iterable[float], decimals: int) -> float:
    """``10^-decimals / 2``, half a unit of the last decimal written, at least 4 float epsilons of the largest
    value: 4 decimals -> 5e-05.

    Args:
        values (Iterable[float]): the values. decimals (int): the decimals they were written with.
    """
    values = [abs(float(v)) for v in values]
    return max(0.5 * 10.0 ** -int(decimals), 4 * math.ulp(max(values, default=0.0)))


def detect_grid(values: Iterable[float], *, decimals: int | None = None, tolerance: float | None = None,
                max_divisor: int = 6, min_distinct: int = 4, min_occupancy: float = 0.5,
                min_ratio: float = MIN_RATIO) -> Grid | None:
    """The grid ``values`` lie on, or None (the module docstring has the rule); None when the precision is unknown.

    Args:
        values (Iterable[float]): recorded values of one score across models and runs (repeats are fine).
        decimals (int | None): the decimals the values were written with (``precision.py``).
        tolerance (float | None): ``tol`` given directly (a precision of 2 tol); one of the two is needed.
        max_divisor (int): the smallest gap may span up to this many grades.
        min_distinct (int): distinct grades needed (at least 4).
        min_occupancy (float): share of the grades between the lowest and highest value that must be seen.
        min_ratio (float): the step must be at least this many precisions.
    """
    import numpy as np

    xs = sorted(float(v) for v in values if math.isfinite(float(v)))
    if tolerance is not None:
        tol = float(tolerance)
    elif decimals is not None:
        tol = value_tolerance(xs, decimals)
    else:
        return None  # the precision is unknown: a float's repr does not say how the value was written
    levels: list[float] = []
    for x in xs:
        if not levels or x - levels[-1] > 2 * tol:
            levels.append(x)
    if len(levels) < max(min_distinct, 4):
        return None
    gaps = [b - a for a, b in zip(levels, levels[1:])]
    smallest = min(gaps)
    for j in range(1, max_divisor + 1):
        step = smallest / j
        if step < min_ratio * 2 * tol:
            return None  # finer steps are closer still to the values' own rounding
        grades = [round((u - levels[0]) / step) for u in levels]
        if len(set(grades)) < len(levels):
            continue
        occupancy = len(levels) / (grades[-1] + 1)
        if occupancy < min_occupancy:
            return None  # finer steps only leave more grades unseen
        design = np.column_stack([np.ones(len(levels)), np.array(grades, dtype=float)])
        (low, fitted), *_ = np.linalg.lstsq(design, np.array(levels), rcond=None)
        residual = float(np.max(np.abs(design @ np.array([low, fitted]) - np.array(levels))))
        if residual > tol or fitted < min_ratio * 2 * tol:
            continue
        low, fitted = float(low), float(fitted)
        whole = round(low / fitted)
        return Grid(fitted, low, tuple(levels), tuple(grades), occupancy,
                    bool(whole >= 0 and abs(low - whole * fitted) <= tol * (1 + whole)), residual, tol)
    return None
