"""McNemar's exact test against scipy.stats.binomtest and a hand computation, through compare and the report.

Tolerances: rel 1e-12 for the p-value against scipy's binomtest (float64 sums of the same binomial terms),
rel 1e-10 for the interval against binomtest's Clopper-Pearson interval (beta quantiles by root-finding on
scipy's side), exact fractions for the hand example."""

from __future__ import annotations

import itertools
import math

import pytest
from scipy import stats

from vecmerge.evidence.difference.mcnemar import mcnemar_test
from vecmerge.evidence.difference.registry import Scores
from vecmerge.evidence.judge.compare import compare_records
from vecmerge.evidence.ledger.ledger import Record
from vecmerge.report.evidence import render_compare


def items(model, values, start=0):
    return [Record(start + i, model, None, "acc", float(v), item=f"q{i}") for i, v in enumerate(values)]


@pytest.mark.parametrize("b, c, n", [(9, 2, 20), (0, 5, 12), (7, 7, 30), (1, 0, 3), (40, 23, 200), (3, 11, 14)])
@pytest.mark.parametrize("confidence", [0.95, 0.9])
def test_p_and_interval_match_scipy_binomtest(b, c, n, confidence):
    r = mcnemar_test(b, c, n, confidence)
    ref = stats.binomtest(b, b + c, 0.5)
    ci = ref.proportion_ci(confidence_level=confidence, method="exact")
    share = (b + c) / n
    assert r.kind == "mcnemar" and r.n == (n,) and r.discordant == (b, c)
    assert r.diff == pytest.approx((b - c) / n, rel=1e-15)
    assert r.p == pytest.approx(ref.pvalue, rel=1e-12)
    assert (r.ci_low, r.ci_high) == pytest.approx((share * (2 * ci.low - 1), share * (2 * ci.high - 1)), rel=1e-10)


def test_a_hand_computed_example():
    """b = 9, c = 2 of n = 20: p = 2 (C(11,0) + C(11,1) + C(11,2)) / 2^11 = 2 * 67 / 2048 = 0.0654296875,
    diff = 7/20, z = 7/sqrt(11), SE under the null sqrt(11) / 20."""
    r = mcnemar_test(9, 2, 20)
    assert r.p == pytest.approx(134 / 2048, rel=1e-14) and r.diff == 0.35
    assert r.t == pytest.approx(7 / math.sqrt(11), rel=1e-15) and r.df == 11
    assert r.se == pytest.approx(math.sqrt(11) / 20, rel=1e-15)
    assert r.ci_low < 0 < r.ci_high and not r.beyond_noise  # p 0.065 > 0.05: the interval holds 0


def test_the_interval_excludes_zero_exactly_when_p_is_below_alpha():
    for b, c in itertools.product(range(0, 16), repeat=2):
        if b + c:
            r = mcnemar_test(b, c, 40)
            assert r.beyond_noise == (r.p < 0.05), (b, c, r.p)


def test_no_test_without_discordant_items_or_for_items_that_are_not_0_1():
    assert mcnemar_test(0, 0, 10) is None
    from vecmerge.evidence.difference.mcnemar import McNemar

    half = Scores(items_a={"q0": 0.5, "q1": 1.0}, items_b={"q0": 0.0, "q1": 0.0})
    assert McNemar().run(half, 0.95) is None
    assert McNemar().run(Scores(items_a={"q0": 1.0, "q1": 0.0}, items_b={"q0": 1.0, "q1": 0.0}), 0.95) is None


def test_compare_reports_it_beside_the_paired_test_s_own_mcnemar_p():
    """0/1 items: the paired test (which takes McNemar's p on 0/1 items, exact under 25 discordant) decides; this
    test's row is reported beside it, with the same exact p and its own interval."""
    a = [1, 1, 0, 1, 1, 0, 1, 1, 1, 0, 1, 1, 1, 1, 0, 1, 1, 1, 0, 1]
    b = [0, 1, 0, 0, 1, 1, 0, 1, 0, 0, 1, 0, 1, 0, 0, 0, 1, 1, 0, 1]
    c = compare_records("A", "B", items("A", a) + items("B", b, 100), higher_is_better=True)
    disc_b = sum(x > y for x, y in zip(a, b))
    disc_c = sum(x < y for x, y in zip(a, b))
    ref = stats.binomtest(7, 8, 0.5).pvalue
    assert (disc_b, disc_c) == (7, 1) and c.decided_by == "paired"
    assert c.mcnemar.p == pytest.approx(ref, rel=1e-12) and c.paired.p == pytest.approx(ref, rel=1e-12)
    assert c.mcnemar.discordant == c.paired.discordant == (7, 1)
    text = render_compare(c.to_dict())
    assert "mcnemar (exact binomial)" in text and "20 items; 7 only A right, 1 only B" in text
    every = compare_records("A", "B", items("A", [1] * 8) + items("B", [0] * 8, 100), higher_is_better=True)
    assert every.mcnemar.p == pytest.approx(2 / 2**8, rel=1e-14) and every.mcnemar.se == pytest.approx(math.sqrt(8) / 8)
    assert every.mcnemar.beyond_noise and every.verdict_code == "a_better"
