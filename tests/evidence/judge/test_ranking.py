"""Ranking candidates: by a calibrated prediction only when the calibration passed; disaster flags by hand."""

from __future__ import annotations

import math
import statistics

import numpy as np
import pytest

from vecmerge.evidence.judge.loo import calibrate_loo
from vecmerge.evidence.judge.ranking import FAR_BELOW, modified_z, rank_candidates

RNG = np.random.default_rng(5)
TRUE = np.linspace(0.90, 1.02, 10)
TARGET = {f"m{i}": list(TRUE[i] + RNG.normal(0, 0.003, 3)) for i in range(10)}
PROXY = {f"m{i}": [float(10 * TRUE[i] + RNG.normal(0, 0.05))] for i in range(10)}
HISTORY = {"p": {m: v[0] for m, v in PROXY.items()}}


def test_modified_z_by_hand():
    others = [1.0, 2.0, 3.0, 4.0, 100.0]
    med, mad = 3.0, statistics.median([2.0, 1.0, 0.0, 1.0, 97.0])  # 1.0
    assert modified_z(-5.0, others) == pytest.approx(0.6745 * (-5.0 - med) / mad, rel=1e-12)
    flat = [2.0, 2.0, 2.0, 5.0]  # MAD 0, mean absolute deviation 0.75
    assert modified_z(1.0, flat) == pytest.approx((1.0 - 2.0) / (1.253314 * 0.75), rel=1e-12)
    assert modified_z(1.0, [2.0, 2.0, 2.0]) == -math.inf and modified_z(2.0, [2.0, 2.0]) == 0.0


def test_a_passing_calibration_ranks_by_the_predicted_target():
    cal = calibrate_loo({"p": PROXY}, TARGET, target_name="t", directions={"t": True})
    assert cal.ranks
    values = {"p": {"x1": 9.5, "x2": 10.1, "x3": 9.9}}
    r = rank_candidates(values, history=HISTORY, calibration=cal, directions={"t": True})
    assert r.mode == "ranking" and [row["candidate"] for row in r.rows] == ["x2", "x3", "x1"]
    assert [row["rank"] for row in r.rows] == [1, 2, 3]
    c = cal.coefficients
    assert r.rows[0]["predicted"] == pytest.approx(c["intercept"] + c["p"] * 10.1, rel=1e-12)
    assert all(not row["extrapolated"] for row in r.rows)
    close = rank_candidates({"p": {"x1": 9.90, "x2": 9.91}}, history=HISTORY, calibration=cal)
    assert any("less than the fit's held-out RMSE" in x for x in close.reasons)
    assert not any("RMSE" in x for x in r.reasons)
    far = rank_candidates({"p": {"x1": 9.5, "x9": 30.0}}, history=HISTORY, calibration=cal)
    assert far.rows[0]["candidate"] == "x9" and far.rows[0]["extrapolated"] == ["p"]
    assert "extrapolate" in far.reasons[-1]
    lower = calibrate_loo({"p": PROXY}, {m: [-v for v in runs] for m, runs in TARGET.items()}, target_name="t",
                          directions={"t": False})
    r = rank_candidates(values, history=HISTORY, calibration=lower, directions={"t": False})
    # a loss (the negated target): x2 still best, now by the lowest predicted value
    assert [row["candidate"] for row in r.rows] == ["x2", "x3", "x1"]
    assert r.rows[0]["predicted"] < r.rows[1]["predicted"] < r.rows[2]["predicted"]


def test_without_a_passing_calibration_it_flags_and_does_not_rank():
    values = {"p": {"x1": 9.5, "x2": 10.1, "broken": 3.0}}
    r = rank_candidates(values, history=HISTORY)
    assert r.mode == "detector" and r.verdict == "disaster detector only" and "no --target" in r.reasons[0]
    assert [row["candidate"] for row in r.rows] == ["x1", "x2", "broken"] and all(x["rank"] is None for x in r.rows)
    assert [row["candidate"] for row in r.rows if row["far_below"]] == ["broken"]
    others = [9.5, 10.1, *HISTORY["p"].values()]
    assert r.rows[2]["z"]["p"] == pytest.approx(modified_z(3.0, others), rel=1e-12) and r.rows[2]["z"]["p"] < -FAR_BELOW
    few = calibrate_loo({"p": {k: PROXY[k] for k in list(PROXY)[:5]}}, TARGET, target_name="t")
    r = rank_candidates(values, history=HISTORY, calibration=few)
    assert r.mode == "detector" and "'too few models'" in r.reasons[0]
    # a lower-is-better proxy is oriented: far *above* is the disaster
    r = rank_candidates({"loss": {"a": 1.0, "b": 1.1, "c": 1.05, "d": 9.0}}, history={}, directions={"loss": False})
    assert [row["candidate"] for row in r.rows if row["far_below"]] == ["d"]
    r = rank_candidates({"p": {"a": 1.0, "b": 0.0}}, history={})
    assert all(row["z"]["p"] is None and not row["far_below"] for row in r.rows) and "fewer than 3" in r.reasons[1]
