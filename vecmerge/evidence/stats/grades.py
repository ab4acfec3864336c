"""Discrete grades: do a score's recorded values lie on a grid, and what is its step?

The user's item-understanding sub-score (懂物料) took the values 0.0920, 0.1226, 0.1533, 0.1840, 0.2146 and
0.2453 across models: steps of 0.0306-0.0307. A model whose ranking improved without crossing the next
grade scores the same; a difference below one grade says nothing about the models beyond "no grade moved".

Detection, over the distinct values u_1 < ... < u_d of the records (values within ``tol`` are one value):

    tol        half a unit of the last decimal the values are written with (0.2453 -> 0.00005), so a
               published, rounded grade still fits; at least 4 float epsilons of the largest value
    candidate  step = g_min / j for j = 1 .. max_divisor, g_min the smallest gap, largest step first; it
               fits when every gap g_i is within 2 tol (1 + k_i / j) of k_i * step, k_i = round(g_i / step) >= 1
    fit        grade indices k_i (from u_1), then least squares u_i = c + step * k_i (numpy), accepted when
               every residual is <= 2 tol and at least ``min_occupancy`` of the grades from u_1 to u_d are seen
    multiples  whether c is itself a whole number of steps (the grades are multiples of the step, from 0)

At least ``min_distinct`` (3) distinct values are needed: two values always lie on some grid. On the user's
six grades: step 0.030663 (least squares), c = 0.091976 = 2.9996 steps (multiples of the step: 0.2453 is
about 8 steps), largest residual 3.9e-05 < 2 tol = 1e-04.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from decimal import Decimal


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


def value_tolerance(values: Iterable[float]) -> float:
    """Half a unit of the last decimal the values are written with (their shortest repr), at least 4 float
    epsilons of the largest: 0.2453 -> 5e-05; 0.1 + 0.2 (0.30000000000000004) -> about 2.7e-16."""
    values = [float(v) for v in values]
    if not values:
        return 0.0
    exponent = min(Decimal(repr(v)).as_tuple().exponent for v in values)
    return max(0.5 * 10.0 ** exponent, 4 * math.ulp(max(abs(v) for v in values)))


def detect_grid(values: Iterable[float], *, tolerance: float | None = None, max_divisor: int = 6,
                min_distinct: int = 3, min_occupancy: float = 0.5) -> Grid | None:
    """The grid ``values`` lie on, or None (the module docstring has the rule).

    Args:
        values (Iterable[float]): recorded values of one score across models and runs (repeats are fine).
        tolerance (float | None): ``tol``; default ``value_tolerance(values)``.
        max_divisor (int): the smallest gap may span up to this many grades.
        min_distinct (int): distinct values needed.
        min_occupancy (float): share of the grades between the lowest and highest value that must be seen.
    """
    import numpy as np

    xs = sorted(float(v) for v in values if math.isfinite(float(v)))
    tol = value_tolerance(xs) if tolerance is None else float(tolerance)
    levels: list[float] = []
    for x in xs:
        if not levels or x - levels[-1] > 2 * tol:
            levels.append(x)
    if len(levels) < max(min_distinct, 3):
        return None
    gaps = [b - a for a, b in zip(levels, levels[1:])]
    smallest = min(gaps)
    for j in range(1, max_divisor + 1):
        step = smallest / j
        ks = [round(g / step) for g in gaps]
        if any(k < 1 or abs(g - k * step) > 2 * tol * (1 + k / j) for g, k in zip(gaps, ks)):
            continue
        grades = [0]
        for k in ks:
            grades.append(grades[-1] + k)
        occupancy = len(levels) / (grades[-1] + 1)
        if occupancy < min_occupancy:
            return None  # finer steps only leave more grades unseen
        design = np.column_stack([np.ones(len(levels)), np.array(grades, dtype=float)])
        (low, fitted), *_ = np.linalg.lstsq(design, np.array(levels), rcond=None)
        residual = float(np.max(np.abs(design @ np.array([low, fitted]) - np.array(levels))))
        if residual > 2 * tol:
            continue
        low, fitted = float(low), float(fitted)
        whole = round(low / fitted)
        return Grid(fitted, low, tuple(levels), tuple(grades), occupancy,
                    bool(whole >= 0 and abs(low - whole * fitted) <= 2 * tol * (1 + whole)), residual, tol)
    return None
