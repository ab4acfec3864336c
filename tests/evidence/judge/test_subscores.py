"""Every sub-score of A against B: each test against scipy, Holm by hand, margins, grades, zero variance,
directions, the target, and the runs that would decide (the one-sided power against a seeded simulation)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from vecmerge.evidence import EvidenceError
from vecmerge.evidence.judge.subscores import NOT_WORSE, UNKNOWN, WORSE, compare_subscores
from vecmerge.evidence.ledger.ledger import Record
from vecmerge.evidence.stats.noise import power_two_sample, repeats_needed

M = "official_total"


def runs(model, subs_per_run, start=0, metric=M):
    """Whole-run records whose values are the sum of their sub-scores (as the official total is)."""
    return [Record(start + i, model, None, metric, sum(s.values()), tuple(sorted(s.items())))
            for i, s in enumerate(subs_per_run)]


A_VIDEO = [0.3112, 0.2894, 0.3307, 0.3021, 0.3188]
B_VIDEO = [0.2716, 0.2803, 0.2641, 0.2738]
A_GOODS = [0.100, 0.112, 0.095, 0.108, 0.101]
B_GOODS = [0.103, 0.099, 0.110, 0.097]


def pair():
    a = runs("v58", [{"video": v, "goods": g, "item": 0.2453} for v, g in zip(A_VIDEO, A_GOODS)])
    b = runs("v54", [{"video": v, "goods": g, "item": 0.2453} for v, g in zip(B_VIDEO, B_GOODS)], start=100)
    return a + b


def test_welch_per_sub_score_against_scipy_and_holm_by_hand():
    c = compare_subscores("v58", "v54", pair(), higher_is_better=True, margins=0.01)
    assert c.family == ("goods", "video")  # item: the same grade in every run of both: decided exactly
    for key, xa, xb in (("video", A_VIDEO, B_VIDEO), ("goods", A_GOODS, B_GOODS)):
        row = c.row(key)
        ref = stats.ttest_ind(xa, xb, equal_var=False)
        assert row.test.kind == "welch" and row.p == pytest.approx(ref.pvalue, rel=1e-10)
        assert row.diff == pytest.approx(np.mean(xa) - np.mean(xb), rel=1e-12)
        ni = stats.ttest_ind(np.array(xa) + 0.01, xb, equal_var=False, alternative="greater")  # H0: A - B <= -0.01
        assert row.p_noninferior == pytest.approx(ni.pvalue, rel=1e-10)
        assert row.a_summary.n == len(xa) and row.b_summary.mean == pytest.approx(np.mean(xb), rel=1e-12)
    # Holm by hand over the two: the smaller p doubles, the larger is max(itself, that)
    (lo, hi) = sorted(["video", "goods"], key=lambda k: c.row(k).p)
    assert c.row(lo).p_holm == pytest.approx(min(1, 2 * c.row(lo).p), rel=1e-12)
    assert c.row(hi).p_holm == pytest.approx(max(c.row(hi).p, min(1, 2 * c.row(lo).p)), rel=1e-12)
    assert c.row("video").status == NOT_WORSE and c.row("item").status == NOT_WORSE
    assert c.row("item").zero_variance and c.row("item").diff == 0.0 and c.row("item").p is None
    # the non-inferiority family by hand: goods p 0.0171 stays (largest), video's 0.00054 doubles to 0.00108
    (small, large) = sorted(["video", "goods"], key=lambda k: c.row(k).p_noninferior)
    assert c.row(small).p_noninferior_holm == pytest.approx(2 * c.row(small).p_noninferior, rel=1e-12)
    assert c.row(large).p_noninferior_holm == pytest.approx(c.row(large).p_noninferior, rel=1e-12)
    assert c.keys(NOT_WORSE) == ["goods", "item", "video"] and c.keys(WORSE) == c.keys(UNKNOWN) == []


def test_a_sub_score_worse_beyond_noise_is_named_even_inside_the_margin():
    a = runs("x", [{"video": v} for v in (0.250, 0.251, 0.249, 0.250)])
    b = runs("y", [{"video": v} for v in (0.260, 0.261, 0.259, 0.260)], start=10)
    c = compare_subscores("x", "y", a + b, higher_is_better=True, margins=0.05)
    row = c.row("video")
    assert row.status == WORSE and "worse beyond noise" in row.reason and c.keys(WORSE) == ["video"]
    assert row.p_holm == pytest.approx(stats.ttest_ind([0.250, 0.251, 0.249, 0.250], [0.260, 0.261, 0.259, 0.260],
                                                       equal_var=False).pvalue, rel=1e-10)


def test_lower_is_better_flips_every_side():
    a = runs("x", [{"loss": v} for v in (1.00, 1.02, 0.98, 1.01)])
    b = runs("y", [{"loss": v} for v in (1.20, 1.22, 1.18, 1.21)], start=10)
    assert compare_subscores("x", "y", a + b, higher_is_better=False, margins=0.01).row("loss").status == NOT_WORSE
    assert compare_subscores("x", "y", a + b, higher_is_better=True, margins=0.01).row("loss").status == WORSE
    row = compare_subscores("x", "y", a + b, higher_is_better=None, margins=0.01).row("loss")
    assert row.status == UNKNOWN and "no direction" in row.reason


def test_paired_per_item_sub_scores_against_scipy():
    rng = np.random.default_rng(0)
    base = rng.uniform(0.2, 0.8, 30)
    ya = base + rng.normal(0.02, 0.05, 30)
    recs = [Record(i, "x", None, "toy", float(v), item=f"q{i}", subscore="start_low") for i, v in enumerate(ya)]
    recs += [Record(100 + i, "y", None, "toy", float(v), item=f"q{i}", subscore="start_low")
             for i, v in enumerate(base)]
    c = compare_subscores("x", "y", recs, higher_is_better=True, margins=0.02)
    row = c.row("start_low")
    ref = stats.ttest_rel(ya, base)
    assert row.test.kind == "paired" and row.p == pytest.approx(ref.pvalue, rel=1e-10)
    assert row.p_noninferior == pytest.approx(stats.ttest_rel(ya + 0.02, base, alternative="greater").pvalue,
                                              rel=1e-10)
    assert row.a_summary is None  # no whole runs: item-level evidence only


def test_zero_variance_is_decided_not_an_error():
    """v51 scored 0.2453 in all five runs; a model one grade lower in three runs is worse, exactly."""
    v51 = runs("v51", [{"item_understanding": 0.2453}] * 5)
    v58 = runs("v58", [{"item_understanding": 0.2453}] * 2, start=10)
    low = runs("v37", [{"item_understanding": 0.1840}] * 3, start=20)
    same = compare_subscores("v58", "v51", v51 + v58 + low, higher_is_better=True).row("item_understanding")
    assert same.status == NOT_WORSE and same.zero_variance and same.diff == 0.0 and same.below_one_grade is None
    worse = compare_subscores("v37", "v51", v51 + v58 + low, higher_is_better=True).row("item_understanding")
    assert worse.status == WORSE and worse.diff == pytest.approx(0.1840 - 0.2453, abs=1e-15)
    one = compare_subscores("v59", "v51", v51 + runs("v59", [{"item_understanding": 0.2453}], start=30),
                            higher_is_better=True).row("item_understanding")
    assert one.status == UNKNOWN and "Welch needs 2" in one.reason  # one run is no evidence of zero spread


def test_margin_defaults_to_one_grade_on_a_grid_else_the_pooled_noise():
    grades = [0.0920, 0.1226, 0.1533, 0.1840, 0.2146, 0.2453]
    recs = [r for i, g in enumerate(grades) for r in runs(f"m{i}", [{"item": g}], start=10 * i)]
    recs += runs("x", [{"item": 0.2453}, {"item": 0.2146}, {"item": 0.2453}], start=100)
    recs += runs("y", [{"item": 0.2146}, {"item": 0.2146}, {"item": 0.2453}], start=200)
    row = compare_subscores("x", "y", recs, higher_is_better=True, decimals={"item": 4}).row("item")
    assert row.grid is not None and row.margin == row.grid.step and row.margin_source.startswith("one grade")
    assert "6 distinct values sit on it within their written precision 1e-04" in row.margin_source
    unknown = compare_subscores("x", "y", recs, higher_is_better=True).row("item")  # precision not known: no grade
    assert unknown.grid is None and unknown.margin_source == "pooled within-model noise sd"
    assert row.below_one_grade and row.diff == pytest.approx(0.0307 / 3, abs=1e-4)
    row = compare_subscores("v58", "v54", pair(), higher_is_better=True).row("video")
    pooled = math.sqrt((np.var(A_VIDEO, ddof=1) * 4 + np.var(B_VIDEO, ddof=1) * 3) / 7)
    assert row.grid is None and row.margin == pytest.approx(pooled, rel=1e-12)
    assert row.margin_source == "pooled within-model noise sd"
    given = compare_subscores("v58", "v54", pair(), higher_is_better=True, margins={"video": 0.02}, margin_source="x")
    assert (given.row("video").margin, given.row("video").margin_source) == (0.02, "x")
    with pytest.raises(EvidenceError, match="margin -1"):
        compare_subscores("v58", "v54", pair(), higher_is_better=True, margins=-1)


def test_the_target_is_reported_but_not_a_constraint():
    c = compare_subscores("v58", "v54", pair(), higher_is_better=True, margins=0.01, target="video")
    assert c.family == ("goods",) and c.row("video").target and c.row("video").p_holm is None
    assert "video" not in c.keys(NOT_WORSE) + c.keys(WORSE) + c.keys(UNKNOWN)
    assert c.row("goods").p_holm == pytest.approx(c.row("goods").p, rel=1e-12)  # a family of one
    d = c.to_dict()
    assert set(d["subscores"]) == {"goods", "item", "video"} and d["cost"]["worse"] == []


def test_undecided_says_how_many_more_runs_would_decide():
    a = runs("x", [{"video": v} for v in (0.300, 0.320)])
    b = runs("y", [{"video": v} for v in (0.305, 0.290)], start=10)
    row = compare_subscores("x", "y", a + b, higher_is_better=True, margins=0.01).row("video")
    assert row.status == UNKNOWN and row.more_runs is not None
    need = repeats_needed(row.better + 0.01, row.noise_sd, alpha=0.05, power=0.8, sides=1)
    assert row.more_runs == need - 2 and power_two_sample(need, row.better + 0.01, row.noise_sd, sides=1) >= 0.8


def test_one_sided_power_against_a_simulation():
    """P(one-sided two-sample t rejects) with n = 6 per model, effect 0.8 sd: noncentral t vs 20,000 seeded runs."""
    rng = np.random.default_rng(11)
    n, effect = 6, 0.8
    a, b = rng.normal(effect, 1, (20000, n)), rng.normal(0, 1, (20000, n))
    sp = np.sqrt((a.var(axis=1, ddof=1) + b.var(axis=1, ddof=1)) / 2)
    t = (a.mean(axis=1) - b.mean(axis=1)) / (sp * math.sqrt(2 / n))
    simulated = np.mean(t > stats.t.ppf(0.95, 2 * n - 2))
    assert power_two_sample(n, effect, 1.0, 0.05, sides=1) == pytest.approx(simulated, abs=0.012)
    assert power_two_sample(n, -effect, 1.0, 0.05, sides=1) < 0.05


def test_lower_is_better_interval_holding_zero_is_not_worse():
    """Issue 36 mutant: for a lower-is-better sub-score the worst plausible ``better`` is -(A - B)'s upper end;
    reading the other end of the interval called an interval holding 0 "worse"."""
    a = runs("x", [{"loss": v} for v in (1.00, 1.04, 0.97, 1.02, 0.99)])
    b = runs("y", [{"loss": v} for v in (1.01, 0.98, 1.03, 1.00, 0.99)], start=10)
    ref = stats.ttest_ind([1.00, 1.04, 0.97, 1.02, 0.99], [1.01, 0.98, 1.03, 1.00, 0.99], equal_var=False)
    lo, hi = ref.confidence_interval(0.95)
    assert lo < 0 < hi and -hi < -0.01 < -lo  # the interval holds 0; only its A-worse end (hi) lies past the margin
    row = compare_subscores("x", "y", a + b, higher_is_better=False, margins=0.01).row("loss")
    assert (row.test.ci_low, row.test.ci_high) == pytest.approx((lo, hi), rel=1e-9)
    assert row.status == UNKNOWN and "not shown either way at margin 0.01" in row.reason
    # the mirror image with higher-is-better: A - B negated is the same question, with the same answer
    flip = compare_subscores("y", "x", a + b, higher_is_better=True, margins=0.01).row("loss")
    assert flip.status == UNKNOWN


def test_zero_spread_verdict_says_its_assumption_and_round_off_is_zero():
    """Issue 33 item 5: three identical 0.092 runs have a float std of 1.7e-17 (round-off of the mean), which
    gave p 1.4e-57; it is no spread, and a verdict resting on no spread says what it assumes."""
    xs = [0.092] * 3
    m = math.fsum(xs) / 3
    assert 0 < math.sqrt(math.fsum((x - m) ** 2 for x in xs) / 2) < 1e-16  # what the float formula gives
    a = runs("v60", [{"item": 0.092}] * 3)
    b = runs("v54", [{"item": 0.1226}] * 3, start=10)
    row = compare_subscores("v60", "v54", a + b, higher_is_better=True).row("item")
    assert row.test is None and row.p is None and row.zero_variance  # no Welch p from round-off
    assert row.status == WORSE and row.diff == pytest.approx(0.092 - 0.1226, abs=1e-15)
    assert "assuming this sub-score does not vary between runs of one model" in row.reason
    same = compare_subscores("v60", "v54", a + runs("v54", [{"item": 0.092}] * 3, start=10),
                             higher_is_better=True).row("item")
    assert same.status == NOT_WORSE and "assuming this sub-score does not vary" in same.reason
