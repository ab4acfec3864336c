"""Training replicates: the test over trainings against scipy's pooled two-sample t test and a hand computation."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from vecmerge.evidence.stats.replicates import components, group_of, members, replicate_evidence

GROUPS = {"v51": ("v51", "v51b", "v51c"), "v28": ("v28", "v28b")}
RUNS = {"v51": [1.010, 1.012, 1.011], "v51b": [0.995, 0.997], "v51c": [1.004, 1.006, 1.005],
        "v28": [0.990, 0.992], "v28b": [0.999, 0.997, 0.998], "v60": [0.9]}


def training_means(names):
    return [np.mean(RUNS[n]) for n in names]


def test_groups_and_members():
    assert group_of("v51b", GROUPS) == "v51" and group_of("v51", GROUPS) == "v51" and group_of("v60", GROUPS) is None
    assert members(["v51", "v60"], GROUPS) == {"v51", "v51b", "v51c", "v60"}


def test_both_sides_replicated_is_scipys_pooled_t_test_on_training_means():
    """The pooled variance of training means within the two groups, df = (3 - 1) + (2 - 1), is exactly the
    classic equal-variance two-sample t test on the training means (scipy.stats.ttest_ind)."""
    r = replicate_evidence("v51", "v28", RUNS, GROUPS, metric="m")
    x, y = training_means(GROUPS["v51"]), training_means(GROUPS["v28"])
    ref = stats.ttest_ind(x, y, equal_var=True)
    ci = ref.confidence_interval(0.95)
    t = r.test
    assert (t.kind, t.n, t.df) == ("trainings", (3, 2), 3.0)
    assert t.diff == pytest.approx(np.mean(x) - np.mean(y), rel=1e-12)
    assert t.t == pytest.approx(ref.statistic, rel=1e-10)
    assert t.p == pytest.approx(ref.pvalue, rel=1e-10) and (t.ci_low, t.ci_high) == pytest.approx(ci, rel=1e-10)
    assert r.trainings == (("v51", "v51b", "v51c"), ("v28", "v28b")) and [g.group for g in r.groups] == ["v51", "v28"]


def test_a_side_without_replicates_borrows_the_other_sides_training_noise():
    """v60 is one training; by hand: s_T² = the sample variance of v51's three training means (df 2),
    SE = s_T sqrt(1/3 + 1/1), t = diff / SE on 2 df."""
    r = replicate_evidence("v51", "v60", RUNS, GROUPS)
    x = training_means(GROUPS["v51"])
    s2 = np.var(x, ddof=1)
    se = math.sqrt(s2 * (1 / 3 + 1))
    diff = np.mean(x) - 0.9
    assert r.noise.df == 2 and r.noise.var == pytest.approx(s2, rel=1e-12)
    assert r.test.se == pytest.approx(se, rel=1e-12) and r.test.p == pytest.approx(
        2 * stats.t.sf(abs(diff / se), 2), rel=1e-10)


def test_no_replicates_no_evidence_and_one_configuration_is_not_compared_with_itself():
    assert replicate_evidence("v60", "v99", RUNS, GROUPS) is None
    assert replicate_evidence("v51", "v28", RUNS, None) is None
    same = replicate_evidence("v51", "v51b", RUNS, GROUPS)
    assert same.test is None and "one configuration" in same.reason


def test_components_of_a_members_group():
    c = components("v51c", GROUPS, RUNS, metric="m", env="e")
    assert c.group == "v51" and c.members == ("v51", "v51b", "v51c") and c.env == "e" and c.runs == (3, 2, 3)
    assert components("v60", GROUPS, RUNS) is None
