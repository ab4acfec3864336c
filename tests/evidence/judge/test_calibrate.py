"""Proxy calibration on constructed proxies: one that tracks the target, one that is noise, too few models."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy import stats

from vecmerge.evidence import EvidenceError
from vecmerge.evidence.judge.calibrate import (
    calibrate,
    calibrate_records,
    kendall_rows,
    noise_ceiling,
    pairwise_accuracy,
    spearman_rows,
)
from vecmerge.evidence.ledger.ledger import Record

RNG = np.random.default_rng(7)
TRUE = np.linspace(0.90, 1.02, 10)  # ten past models, evenly spread true target means
TARGET = {f"m{i}": list(TRUE[i] + RNG.normal(0, 0.004, 3)) for i in range(10)}  # three official runs each
TRACKING = {f"m{i}": [float(TRUE[i] + RNG.normal(0, 0.01))] for i in range(10)}
NOISE = {f"m{i}": [float(RNG.normal(0, 1))] for i in range(10)}


def means(runs):
    return np.array([np.mean(v) for v in runs.values()])


def test_a_tracking_proxy_ranks_candidates():
    c = calibrate(TRACKING, TARGET, proxy_name="local_cv", target_name="official_total")
    p, t = means(TRACKING), means(TARGET)
    rho, rho_p = stats.spearmanr(p, t)
    tau, tau_p = stats.kendalltau(p, t)
    assert (c.spearman, c.spearman_p) == pytest.approx((rho, rho_p), rel=1e-12)
    assert (c.kendall, c.kendall_p) == pytest.approx((tau, tau_p), rel=1e-12)
    assert c.spearman > 0.9 and c.spearman_ci[0] >= 0.5 and c.spearman_ci[0] <= c.spearman_ci[1]
    assert c.verdict == "ranks candidates" and c.models == tuple(TARGET) and c.boot_valid > 1900
    assert c == calibrate(TRACKING, TARGET, proxy_name="local_cv", target_name="official_total")  # seeded


def test_a_noise_proxy_is_a_disaster_detector_only():
    c = calibrate(NOISE, TARGET)
    assert c.verdict == "disaster detector only" and c.spearman_ci[0] < 0.5
    assert c.spearman == pytest.approx(stats.spearmanr(means(NOISE), means(TARGET))[0], rel=1e-12)
    assert any("lower bound" in r for r in c.reasons)


def test_too_few_models_even_for_a_perfect_proxy():
    few = {k: TARGET[k] for k in list(TARGET)[:5]}
    c = calibrate({k: [np.mean(v)] for k, v in few.items()}, few)
    assert c.verdict == "too few models" and c.spearman == pytest.approx(1.0) and "5 models" in c.reasons[0]
    assert calibrate(TRACKING, TARGET, min_models=12).verdict == "too few models"  # the threshold is a parameter
    two = calibrate({"a": [1.0], "b": [2.0]}, {"a": [1.0], "b": [2.0], "c": [3.0]})
    assert two.verdict == "too few models" and two.spearman is None and two.pairwise_accuracy == 1.0
    with pytest.raises(EvidenceError, match="min_models=2"):
        calibrate(TRACKING, TARGET, min_models=2)


def test_a_lower_is_better_proxy_is_flipped():
    loss = {k: [-v[0]] for k, v in TRACKING.items()}
    c = calibrate(loss, TARGET, proxy_higher_is_better=False, target_higher_is_better=True)
    assert c.flipped and c.verdict == "ranks candidates"
    unflipped = calibrate(loss, TARGET)
    assert unflipped.spearman < 0 and any("negative" in r for r in unflipped.reasons)


def test_bootstrap_interval_against_a_plain_loop():
    """The vectorized bootstrap must equal a loop over the same resamples with scipy's functions."""
    c = calibrate(TRACKING, TARGET, n_boot=300, seed=3)
    p, t = means(TRACKING), means(TARGET)
    idx = np.random.default_rng(3).integers(0, 10, (300, 10))
    rhos, taus = [], []
    for row in idx:
        if np.ptp(p[row]) > 0 and np.ptp(t[row]) > 0:
            rhos.append(stats.spearmanr(p[row], t[row])[0])
            taus.append(stats.kendalltau(p[row], t[row])[0])
    assert c.boot_valid == len(rhos)
    assert c.spearman_ci == pytest.approx(tuple(np.quantile(rhos, [0.025, 0.975])), rel=1e-12)
    assert c.kendall_ci == pytest.approx(tuple(np.quantile(taus, [0.025, 0.975])), rel=1e-12)


def test_row_correlations_with_ties_match_scipy():
    rng = np.random.default_rng(11)
    x = rng.integers(0, 4, (50, 9)).astype(float)
    y = rng.integers(0, 4, (50, 9)).astype(float)
    rho, tau = spearman_rows(x, y), kendall_rows(x, y)
    for i in range(50):
        assert rho[i] == pytest.approx(stats.spearmanr(x[i], y[i])[0], rel=1e-12, nan_ok=True)
        assert tau[i] == pytest.approx(stats.kendalltau(x[i], y[i])[0], rel=1e-12, nan_ok=True)
    assert np.isnan(spearman_rows(np.ones((1, 4)), x[:1, :4]))[0]


def test_pairwise_accuracy_by_hand():
    """target 1 < 2 < 3 (= 3); proxy 0.1, 0.3, 0.2, 0.2. Pairs with different targets: (0,1) agree,
    (0,2) agree, (0,3) agree, (1,2) disagree, (1,3) disagree; (2,3) tied in the target: left out -> 3/5."""
    assert pairwise_accuracy([0.1, 0.3, 0.2, 0.2], [1, 2, 3, 3]) == (pytest.approx(0.6), 5)
    assert pairwise_accuracy([0.1, 0.1], [1, 2]) == (0.5, 1)  # a proxy tie counts half


def test_noise_ceiling_exact_enumeration():
    """Three models with two runs each: 2³ = 8 equally likely choices of one run per model; the ceiling
    is the mean over them of Spearman(chosen run, the other run) (scipy)."""
    runs = {"a": [0.90, 0.95], "b": [0.93, 0.91], "c": [0.99, 0.97], "d": [1.0]}  # d: one run, left out
    got, used = noise_ceiling(runs)
    rhos = []
    for pick in itertools.product([0, 1], repeat=3):
        single = [runs[m][k] for m, k in zip("abc", pick)]
        other = [runs[m][1 - k] for m, k in zip("abc", pick)]
        rhos.append(stats.spearmanr(single, other)[0])
    assert used == 3 and got == pytest.approx(np.mean(rhos), rel=1e-12)
    assert noise_ceiling({"a": [1, 2], "b": [1, 2]}) == (None, 2)


def test_noise_ceiling_of_a_noisy_target_is_reported():
    rng = np.random.default_rng(12)
    noisy = {f"m{i}": list(TRUE[i] + rng.normal(0, 0.2, 2)) for i in range(10)}
    c = calibrate(TRACKING, noisy)
    assert c.noise_ceiling is not None and c.noise_ceiling < 0.5 and c.noise_ceiling_models == 10
    assert any("itself is noisy" in r for r in c.reasons)


def test_calibrate_over_ledger_records():
    records, i = [], 0
    for metric, runs in (("local_cv", TRACKING), ("official_total", TARGET)):
        for model, values in runs.items():
            for v in values:
                records.append(Record(i, model, None, metric, float(v)))
                i += 1
    c = calibrate_records(records, "local_cv", "official_total", directions={"local_cv": True})
    assert c == calibrate(TRACKING, TARGET, proxy_name="local_cv", target_name="official_total")


# -- issue 23: the bugs these tests let live: a lower-is-better target, and the verdict's boundary -----------------
LOSS_TARGET = {k: [-x for x in v] for k, v in TARGET.items()}  # a loss: lower is better; same models, reversed


@pytest.mark.parametrize("proxy_direction", [None, False])
def test_a_perfect_proxy_of_a_lower_is_better_target_ranks_candidates(proxy_direction):
    """The proxy IS the target's mean (a perfect proxy of a loss). Declared lower-is-better or left undeclared,
    it must rank candidates; an undeclared proxy used to be taken as higher-is-better, negated, and called a
    disaster detector with rho = -1."""
    perfect = {k: [float(np.mean(v))] for k, v in LOSS_TARGET.items()}
    c = calibrate(perfect, LOSS_TARGET, proxy_higher_is_better=proxy_direction, target_higher_is_better=False)
    assert not c.flipped and c.spearman == pytest.approx(1.0) and c.spearman_ci[0] == pytest.approx(1.0)
    assert c.verdict == "ranks candidates", c.reasons


@pytest.mark.parametrize("target_direction", [True, False])
def test_a_proxy_of_the_opposite_declared_direction_is_flipped_in_both_directions(target_direction):
    target = TARGET if target_direction else LOSS_TARGET
    opposite = {k: [-float(np.mean(v))] for k, v in target.items()}  # e.g. a loss proxy of an accuracy target
    c = calibrate(opposite, target, proxy_higher_is_better=not target_direction,
                  target_higher_is_better=target_direction)
    assert c.flipped and c.spearman == pytest.approx(1.0) and c.verdict == "ranks candidates"
    same = calibrate(opposite, target, proxy_higher_is_better=target_direction,
                     target_higher_is_better=target_direction)
    assert not same.flipped and same.spearman == pytest.approx(-1.0) and same.verdict == "disaster detector only"


@pytest.mark.parametrize("higher", [True, False])
def test_the_verdict_is_taken_from_the_bootstrap_lower_bound_at_its_boundary(higher):
    """A proxy whose point estimate clears the threshold while its bootstrap lower bound does not is a disaster
    detector; the verdict flips exactly where min_spearman_low crosses the lower bound (>= ranks), in either
    metric direction (the records' values negated for lower-is-better)."""
    sign = 1.0 if higher else -1.0
    rng = np.random.default_rng(5)
    proxy = {k: [sign * float(np.mean(v) + rng.normal(0, 0.03))] for k, v in TARGET.items()}
    target = {k: [sign * x for x in v] for k, v in TARGET.items()}
    c = calibrate(proxy, target, proxy_higher_is_better=higher, target_higher_is_better=higher)
    low = c.spearman_ci[0]
    assert c.spearman > low + 0.05  # the point estimate and the bound differ enough to tell them apart
    between = (c.spearman + low) / 2  # the point estimate clears it, the lower bound does not
    assert calibrate(proxy, target, proxy_higher_is_better=higher, target_higher_is_better=higher,
                     min_spearman_low=between).verdict == "disaster detector only"
    at = calibrate(proxy, target, proxy_higher_is_better=higher, target_higher_is_better=higher, min_spearman_low=low)
    assert at.verdict == "ranks candidates"  # exactly at the bound: >=
    above = calibrate(proxy, target, proxy_higher_is_better=higher, target_higher_is_better=higher,
                      min_spearman_low=float(np.nextafter(low, 2.0)))
    assert above.verdict == "disaster detector only"


def test_perfect_rank_correlation_gets_an_exact_p_not_zero():
    """Issue 33 item 7: a perfect order of 5 models printed "p 0" (scipy's t approximation, 1.4e-24); the exact
    permutation p, counted over all 120 orders of the target, is 2/120."""
    few = {k: TARGET[k] for k in list(TARGET)[:5]}
    proxy = {k: [np.mean(v)] for k, v in few.items()}
    c = calibrate(proxy, few)
    x = [np.mean(few[k]) for k in few]
    extreme = sum(abs(stats.spearmanr(x, perm).statistic) > 1 - 1e-12 for perm in itertools.permutations(x))
    assert c.spearman == 1.0 and c.spearman_p == pytest.approx(extreme / 120, rel=1e-12) == 2 / 120
    assert c.kendall_p == pytest.approx(2 / 120, rel=1e-9)  # scipy's exact Kendall p agrees
    from vecmerge.report.evidence import render_calibrate

    text = render_calibrate(c.to_dict())
    assert "1  95% bootstrap CI" in text and ", p 0.0167\n" in text and ", p 0\n" not in text
