"""Discrete grades: do a score's recorded values lie on a grid, and what is its step? Only when the data show it.

The user's item-understanding sub-score (懂物料) took the values 0.0920, 0.1226, 0.1533, 0.1840, 0.2146 and
0.2453 across models: steps of 0.0306-0.0307. A model whose ranking improved without crossing the next
grade scores the same; a difference below one grade says nothing about the models beyond "no grade moved".

Detection, over the distinct values u_1 < ... < u_d of the records (values within ``tol`` are one value):

    precision  p = 10^-decimals, the decimals the values were WRITTEN with (the input's text, ``precision.py``,
               or a declared ``--decimals``), never a float's repr; unknown precision: no grade
    tol        p / 2 (a written value is within half a unit of its last decimal), at least 4 float epsilons
    candidate  step = g_min / j for j = 1 .. max_divisor, g_min the smallest gap, largest step first; only a
               step of at least ``min_ratio`` (10) precisions counts
    fit        grade indices k_i = round((u_i - u_1) / step), then least squares u_i = c + step * k_i (numpy),
               accepted when every residual is <= tol (the values sit on the grid within their precision), at
               least ``min_distinct`` (4) distinct grades occur and ``min_occupancy`` of the grades from u_1 to
               u_d are seen
    multiples  whether c is itself a whole number of steps (the grades are multiples of the step, from 0)

On the user's six grades (4 decimals): step 0.030663 = 307 precisions, largest residual 3.9e-05 <= 5e-05.
{0.145, 0.148, 0.151, 0.153} (3 decimals): the smallest gap 0.002 is 2 precisions: no grade. lm-eval's
{0.2, 0.325, 0.45}: three values, no grade. Random 3-decimal values: a grid in under 1% (``test_grades``).
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
