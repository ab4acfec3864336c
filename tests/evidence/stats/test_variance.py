"""Variance components of training replicates: the hand computation of the docstring, an independent numpy/scipy
ANOVA (balanced and not), the MLS interval's defining property, and a seeded simulation with known components."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from vecmerge.evidence.stats.variance import variance_components

HAND = {"A": [1.00, 1.02], "B": [0.96, 0.98], "C": [1.01, 1.03]}


def test_the_docstrings_hand_computation():
    """variance_components' docstring: MSB 0.0014, MSW 0.0002, n0 2, σ̂²_b 0.0006, σ̂²_w 0.0002, the χ² interval
    [0.0006 / 9.3484, 0.0006 / 0.21580] and the MLS upper end 0.027524 (its lower end -0.00066 truncated)."""
    c = variance_components(HAND, group="A", metric="m")
    assert (c.trainings, c.evaluations, c.runs, c.df_between, c.df_within) == (3, 6, (2, 2, 2), 2, 3)
    assert c.ms_between == pytest.approx(0.0014, rel=1e-12) and c.ms_within == pytest.approx(0.0002, rel=1e-12)
    assert c.n0 == 2.0 and c.var_between_training == pytest.approx(0.0006, rel=1e-12)
    assert c.var_within_eval == pytest.approx(0.0002, rel=1e-12)
    assert c.ci_within_eval == pytest.approx((0.0006 / 9.3484, 0.0006 / 0.21580), rel=1e-4)
    assert c.ci_within_eval == pytest.approx((6.4182e-05, 2.7804e-03), rel=1e-4)
    assert c.ci_between_training[0] == 0.0 and c.ci_between_training[1] == pytest.approx(0.027524, rel=1e-4)
    assert c.sd_total == pytest.approx(math.sqrt(0.0008), rel=1e-12)
    assert c.to_dict()["var_between_training"] == c.var_between_training


def independent_anova(groups, confidence=0.95):
    """The same estimates from the textbook formulas, in numpy and scipy, sharing nothing with the module."""
    ys = [np.asarray(g, dtype=float) for g in groups]
    n = np.array([len(y) for y in ys])
    k, total = len(ys), n.sum()
    grand = np.concatenate(ys).mean()
    ssb = sum(len(y) * (y.mean() - grand) ** 2 for y in ys)
    ssw = sum(((y - y.mean()) ** 2).sum() for y in ys)
    v1, v2 = k - 1, total - k
    msb, msw = ssb / v1, ssw / v2
    n0 = (total - (n**2).sum() / total) / v1
    a = 1 - confidence
    chi, f = stats.chi2.ppf, stats.f.ppf
    g1, h1 = 1 - v1 / chi(1 - a / 2, v1), v1 / chi(a / 2, v1) - 1
    g2, h2 = 1 - v2 / chi(1 - a / 2, v2), v2 / chi(a / 2, v2) - 1
    fu, fl = f(1 - a / 2, v1, v2), f(a / 2, v1, v2)
    g12 = ((fu - 1) ** 2 - g1**2 * fu**2 - h2**2) / fu
    h12 = ((1 - fl) ** 2 - h1**2 * fl**2 - g2**2) / fl
    theta = (msb - msw) / n0
    low = theta - np.sqrt(g1**2 * msb**2 + h2**2 * msw**2 + g12 * msb * msw) / n0
    high = theta + np.sqrt(h1**2 * msb**2 + g2**2 * msw**2 + h12 * msb * msw) / n0
    return theta, msw, (max(low, 0), max(high, 0)), (ssw / chi(1 - a / 2, v2), ssw / chi(a / 2, v2)), msb, fu


@pytest.mark.parametrize("groups", [
    [[1.00, 1.02, 1.01], [0.96, 0.98, 0.95], [1.01, 1.03, 1.05], [0.99, 0.97, 1.00]],  # balanced
    [[1.00, 1.02], [0.96, 0.98, 0.95, 0.97], [1.01], [0.99, 0.97, 1.00]],                # unbalanced, one single run
])
def test_against_an_independent_anova(groups):
    c = variance_components({f"t{i}": g for i, g in enumerate(groups)}, confidence=0.9)
    theta, msw, ci_b, ci_w, msb, _ = independent_anova(groups, 0.9)
    assert c.var_between_training_raw == pytest.approx(theta, rel=1e-10)
    assert c.var_within_eval == pytest.approx(msw, rel=1e-10) and c.ms_between == pytest.approx(msb, rel=1e-10)
    assert c.ci_between_training == pytest.approx(ci_b, rel=1e-10, abs=1e-15)
    assert c.ci_within_eval == pytest.approx(ci_w, rel=1e-10)
    # scipy's one-way ANOVA F is MSB / MSW: the same table
    assert c.ms_between / c.ms_within == pytest.approx(stats.f_oneway(*groups).statistic, rel=1e-10)


def test_the_mls_lower_end_is_zero_exactly_at_the_f_tests_boundary():
    """The MLS lower bound is 0 exactly when MSB / MSW equals F_{1-α/2}(ν1, ν2): build such data (3 trainings of
    2 runs; within spread fixed, the training means scaled until F = Fu) and check the bound vanishes there."""
    fu = stats.f.ppf(0.975, 2, 3)
    base = np.array([-1.0, 0.0, 1.0])  # training offsets; each training's runs are offset ± 0.01
    msw = 0.01**2 * 2 * 3 / 3          # SSW = 6 x 0.0001, ν2 = 3
    scale = math.sqrt(fu * msw / (2 * (base**2).sum() / 2))  # MSB = 2 Σ (s b_i)² / 2 = Fu · MSW
    groups = {f"t{i}": [s * scale + 0.01, s * scale - 0.01] for i, s in enumerate(base)}
    c = variance_components(groups)
    assert c.ms_between / c.ms_within == pytest.approx(fu, rel=1e-10)
    assert abs(c.ci_between_training[0]) < 1e-12 * c.ms_between
    bigger = variance_components({f"t{i}": [s * scale * 1.1 + 0.01, s * scale * 1.1 - 0.01]
                                  for i, s in enumerate(base)})
    assert bigger.ci_between_training[0] > 0  # past the boundary (F > Fu) the lower end leaves 0


def test_a_negative_estimate_is_reported_raw_and_truncated():
    c = variance_components({"a": [1.0, 1.2], "b": [1.1, 0.9], "c": [1.05, 1.05]})
    assert c.var_between_training_raw < 0 and c.var_between_training == 0.0 and c.sd_training == 0.0
    assert c.ci_between_training[0] == 0.0


def test_nothing_separates_the_noises_without_two_trainings_and_a_second_run():
    assert variance_components({"a": [1.0, 1.1, 1.2]}) is None            # one training
    assert variance_components({"a": [1.0], "b": [1.1], "c": [0.9]}) is None  # each evaluated once
    assert variance_components({"a": [1.0, 1.1], "b": []}) is None        # a training without runs is left out


def test_a_seeded_simulation_with_known_components():
    """y_ij = t_i + e_ij with σ²_b = 4e-4 and σ²_w = 1e-4 (training noise four times the evaluation noise), 6
    trainings of 3 runs, 1500 data sets: the method-of-moments estimates are unbiased (mean within 6%, about 3
    standard errors of the mean) and both 95% intervals cover near 95% (within ±0.02, about 3.5 standard errors)."""
    rng = np.random.default_rng(28)
    sb, sw, k, n, reps = 4e-4, 1e-4, 6, 3, 1500
    raw, within, cover_b, cover_w = [], [], 0, 0
    for _ in range(reps):
        y = rng.normal(0, math.sqrt(sb), (k, 1)) + rng.normal(0, math.sqrt(sw), (k, n)) + 0.95
        c = variance_components({f"t{i}": list(row) for i, row in enumerate(y)})
        raw.append(c.var_between_training_raw)
        within.append(c.var_within_eval)
        cover_b += c.ci_between_training[0] <= sb <= c.ci_between_training[1]
        cover_w += c.ci_within_eval[0] <= sw <= c.ci_within_eval[1]
    assert np.mean(raw) == pytest.approx(sb, rel=0.06) and np.mean(within) == pytest.approx(sw, rel=0.03)
    assert abs(cover_b / reps - 0.95) < 0.02 and abs(cover_w / reps - 0.95) < 0.02
