"""Leave-one-model-out calibration against an independent leave-one-out: numpy's lstsq refit without each model.

The module under test uses the hat-matrix identity (one SVD, no refits) and scipy's gelsd where a model has
leverage 1; the reference below refits n times with ``numpy.linalg.lstsq``. Statistics of the held-out predictions
are checked against scipy, verdicts on constructed proxies (a tracking one, noise, too few models), and directions
on a lower-is-better target.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from vecmerge.evidence import EvidenceError
from vecmerge.evidence.judge.calibrate import calibrate, pairwise_accuracy
from vecmerge.evidence.judge.loo import calibrate_loo, calibrate_loo_records, held_out_predictions, least_squares
from vecmerge.evidence.ledger.ledger import Record

RNG = np.random.default_rng(11)
N = 12
TRUE = np.linspace(0.90, 1.02, N)
TARGET = {f"m{i}": list(TRUE[i] + RNG.normal(0, 0.003, 3)) for i in range(N)}
TRACK = {f"m{i}": [float(-40 + 50 * TRUE[i] + RNG.normal(0, 0.3))] for i in range(N)}
OTHER = {f"m{i}": [float(RNG.normal(0, 1))] for i in range(N)}
NOISE = {f"m{i}": [float(RNG.normal(0, 1))] for i in range(N)}


def reference_loo(X, y):
    """Refit without each model (numpy lstsq, intercept column) and predict it."""
    Z = np.column_stack([np.ones(len(y)), X])
    out = []
    for i in range(len(y)):
        rest = np.arange(len(y)) != i
        beta = np.linalg.lstsq(Z[rest], y[rest], rcond=None)[0]
        out.append(Z[i] @ beta)
    return np.array(out)


@pytest.mark.parametrize("k", [1, 2, 3])
def test_held_out_predictions_equal_refits(k):
    X = RNG.normal(size=(10, k))
    y = X @ RNG.normal(size=k) + RNG.normal(0, 0.1, 10)
    np.testing.assert_allclose(held_out_predictions(X, y), reference_loo(X, y), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(least_squares(X, y), np.linalg.lstsq(np.column_stack([np.ones(10), X]), y,
                                                                    rcond=None)[0], rtol=1e-10)


def test_a_model_with_leverage_one_is_refit():
    X = np.array([[0.0, 0], [1, 0], [2, 0], [3, 0], [1.5, 1.0]])  # only the last model sets the second slope
    y = np.array([1.0, 2.1, 2.9, 4.2, 7.0])
    got = held_out_predictions(X, y)
    np.testing.assert_allclose(got, reference_loo(X, y), rtol=1e-10)  # numpy's minimum-norm refit agrees
    assert np.isfinite(got).all()


def test_a_tracking_proxy_ranks_candidates_held_out():
    c = calibrate_loo({"probe": TRACK}, TARGET, target_name="official")
    y = np.array([np.mean(TARGET[m]) for m in TARGET])
    X = np.array([[TRACK[m][0]] for m in TARGET])
    pred = reference_loo(X, y)
    np.testing.assert_allclose(c.predictions, pred, rtol=1e-10)
    rho, rho_p = stats.spearmanr(pred, y)
    tau, tau_p = stats.kendalltau(pred, y)
    assert (c.spearman, c.spearman_p, c.kendall, c.kendall_p) == pytest.approx((rho, rho_p, tau, tau_p), rel=1e-10)
    assert c.pairwise_accuracy == pairwise_accuracy(list(pred), list(y))[0]
    assert c.rmse == pytest.approx(float(np.sqrt(np.mean((pred - y) ** 2))), rel=1e-10)
    assert c.verdict == "ranks candidates" and c.spearman_ci[0] >= 0.5 and c.ranks
    assert c.coefficients["probe"] == pytest.approx(np.polyfit(X[:, 0], y, 1)[0], rel=1e-8)
    assert c.predict({"probe": 1.0}) == pytest.approx(c.coefficients["intercept"] + c.coefficients["probe"], rel=1e-12)
    assert c == calibrate_loo({"probe": TRACK}, TARGET, target_name="official")  # seeded
    d = c.to_dict()
    assert [r["model"] for r in d["held_out"]] == list(TARGET) and d["held_out"][0]["proxy:probe"] == TRACK["m0"][0]


def test_two_proxies_are_fit_together():
    c = calibrate_loo({"probe": TRACK, "other": OTHER}, TARGET)
    X = np.array([[TRACK[m][0], OTHER[m][0]] for m in TARGET])
    y = np.array([np.mean(TARGET[m]) for m in TARGET])
    np.testing.assert_allclose(c.predictions, reference_loo(X, y), rtol=1e-10)
    assert c.proxies == ("probe", "other") and set(c.coefficients) == {"intercept", "probe", "other"}


def test_noise_is_a_disaster_detector_and_few_models_are_too_few():
    noise = calibrate_loo({"noise": NOISE}, TARGET)
    assert noise.verdict == "disaster detector only" and any("lower bound" in r for r in noise.reasons)
    few = {k: TARGET[k] for k in list(TARGET)[:7]}
    c = calibrate_loo({"probe": TRACK}, few)
    assert c.verdict == "too few models" and "7 models" in c.reasons[0] and c.predictions is not None
    tiny = calibrate_loo({"a": TRACK, "b": OTHER, "c": NOISE}, {k: TARGET[k] for k in list(TARGET)[:5]},
                         min_models=3)
    assert tiny.verdict == "too few models" and tiny.predictions is None and "at least 6" in tiny.reasons[0]
    with pytest.raises(EvidenceError, match="min_models=2"):
        calibrate_loo({"probe": TRACK}, TARGET, min_models=2)


def test_a_lower_is_better_target_keeps_a_perfect_proxy_perfect():
    """A loss-like target, its own values as the proxy: held-out rho = 1 whatever the declared directions."""
    loss = {m: [2.0 - v for v in runs] for m, runs in TARGET.items()}
    same = {m: [float(np.mean(v))] for m, v in loss.items()}
    for declared in ({"loss": False}, {"loss": False, "probe": False}, {"loss": False, "probe": True}, {}):
        c = calibrate_loo({"probe": same}, loss, target_name="loss", directions=declared)
        assert c.spearman == pytest.approx(1.0) and c.verdict == "ranks candidates", declared
    assert any("against its declared direction" in r for r in
               calibrate_loo({"probe": same}, loss, target_name="loss",
                             directions={"loss": False, "probe": True}).reasons)
    plain = calibrate(same, loss, proxy_higher_is_better=None, target_higher_is_better=False)
    assert not plain.flipped and plain.spearman == pytest.approx(1.0) and plain.verdict == "ranks candidates"
    assert calibrate(same, loss, proxy_higher_is_better=True, target_higher_is_better=False).flipped


def test_over_ledger_records_with_candidates_left_out():
    recs, i = [], 0
    for m in TARGET:
        for v in TARGET[m]:
            recs.append(Record(i := i + 1, m, None, "official", v))
        recs.append(Record(i := i + 1, m, None, "probe", TRACK[m][0]))
        recs.append(Record(i := i + 1, m, None, "probe", 99.0, item="x"))  # item-level: not a run
    recs.append(Record(i + 1, "cand", None, "probe", 5.0))
    c = calibrate_loo_records(recs, ["probe"], "official", directions={"official": True}, exclude=["m0"])
    assert c.models == tuple(list(TARGET)[1:]) and c.target_higher_is_better is True
    assert c.proxy_means["probe"][0] == TRACK["m1"][0]
