"""Discrete grades: the grid of the user's published item-understanding (懂物料) grades, what is not a grid, and
the false-grid rate on random values (issue 33 item 4)."""

from __future__ import annotations

import numpy as np
import pytest

from vecmerge.evidence.stats.grades import detect_grid, value_tolerance

GRADES = [0.0920, 0.1226, 0.1533, 0.1840, 0.2146, 0.2453]  # the account's six grades, in order


def test_the_users_grades_lie_on_a_grid_of_about_0_0307():
    grid = detect_grid(GRADES, decimals=4)
    assert grid is not None and grid.grades == (0, 1, 2, 3, 4, 5) and grid.occupancy == 1.0
    # independent: the end-to-end step (0.2453 - 0.0920) / 5 = 0.03066, and numpy's least-squares line
    assert grid.step == pytest.approx((0.2453 - 0.0920) / 5, abs=2e-5)
    slope, intercept = np.polyfit(np.arange(6), GRADES, 1)
    assert grid.step == pytest.approx(slope, rel=1e-12) and grid.low == pytest.approx(intercept, rel=1e-12)
    assert 0.0306 <= grid.step <= 0.0307  # "相邻档位大约相差 0.0306-0.0307"
    assert grid.tolerance == 5e-05 and grid.max_residual < 2 * grid.tolerance
    assert grid.multiples and round(grid.low / grid.step) == 3  # 0.0920 is three steps, 0.2453 eight
    assert round(0.2453 / grid.step) == 8 and abs(0.2453 - 8 * grid.step) < 1e-4


def test_grades_with_gaps_and_repeats_find_the_same_step():
    """What scores.csv and history.csv hold: v34-v36's 0.0920/0.1226/0.1533 and v51's five runs of 0.2453."""
    grid = detect_grid([0.0920, 0.1226, 0.1533] + [0.2453] * 7, decimals=4)
    assert grid is not None and grid.grades == (0, 1, 2, 5) and grid.occupancy == pytest.approx(4 / 6)
    assert grid.step == pytest.approx(detect_grid(GRADES, decimals=4).step, abs=1e-5)


def test_below_one_grade():
    grid = detect_grid(GRADES, decimals=4)
    assert grid.below_one_grade(0.0) and grid.below_one_grade(0.02)
    assert not grid.below_one_grade(0.2453 - 0.2146) and not grid.below_one_grade(-0.0307)
    assert grid.in_grades(0.2453 - 0.1840) == pytest.approx(2.0, abs=0.01)


def test_what_is_not_a_grid():
    assert detect_grid([0.2453] * 5, decimals=4) is None  # one value
    assert detect_grid([0.2146, 0.2453, 0.1840], decimals=4) is None  # three values: four grades are needed
    assert detect_grid([0.11, 0.23, 0.37, 0.52], decimals=2) is None
    assert detect_grid([1.0180, 0.9895, 1.0004, 1.0105, 1.0142], decimals=4) is None  # v51's totals: continuous
    assert detect_grid(GRADES) is None  # the precision unknown: no grade (a float's repr does not say it)
    rng = np.random.default_rng(7)
    assert sum(detect_grid(np.round(rng.uniform(0, 1, 5), 4), decimals=4) is not None for _ in range(500)) == 0
    assert sum(detect_grid(rng.uniform(0, 1, 5), decimals=17) is not None for _ in range(500)) == 0


def test_computed_fractions_lie_on_their_grid():
    """Accuracies k/64 of a 64-item run: step 1/64 exactly, at full float precision."""
    values = [k / 64 for k in (3, 5, 6, 9, 10, 11)]
    grid = detect_grid(values, decimals=6)  # 3/64 = 0.046875 is written with 6
    assert grid is not None and grid.step == pytest.approx(1 / 64, rel=1e-12) and grid.multiples


def test_value_tolerance_is_half_the_last_decimal():
    assert value_tolerance([0.2453, 0.1], 4) == pytest.approx(5e-05)
    assert value_tolerance([1.5], 1) == pytest.approx(0.05)
    assert 0 < value_tolerance([0.1 + 0.2], 17) < 1e-15  # at least 4 epsilons
    assert value_tolerance([], 3) == 0.0005


def test_invented_grades_are_no_grid():
    """Issue 33 item 4's findings: {0.145, 0.148, 0.151, 0.153} became "grades of 0.0016" (0.1480 read as 3
    decimals from its repr); lm-eval's facts_place {0.2, 0.325, 0.45} became "grades of 0.125" (the step is 1/40)."""
    for decimals in (3, 4):  # as written (0.145) or with the trailing zero (0.1480)
        assert detect_grid([0.145, 0.148, 0.151, 0.153], decimals=decimals) is None
    assert detect_grid([0.2, 0.325, 0.45], decimals=3) is None  # three values: no grade, not 0.125
    assert detect_grid([0.2, 0.325, 0.45] * 4, decimals=3) is None  # repeats are not more grades
    # four distinct multiples of 1/40 do show it: 0.025, found from the text's 3 decimals
    grid = detect_grid([0.2, 0.225, 0.25, 0.3], decimals=3)
    assert grid is not None and grid.step == pytest.approx(1 / 40, rel=1e-9) and grid.multiples


@pytest.mark.parametrize("n", [3, 4, 5])
def test_false_grid_rate_on_random_three_decimal_values_is_below_one_percent(n):
    """Seeded: uniform values on [0, 1] written with 3 decimals; a grid was "found" 39% / 12% / 6% of the time
    with 3 / 4 / 5 values. Measured here over 4000 draws each (the rate and its count are both checked)."""
    rng = np.random.default_rng(2026 + n)
    found = sum(detect_grid(np.round(rng.uniform(0, 1, n), 3), decimals=3) is not None for _ in range(4000))
    assert found / 4000 < 0.01
