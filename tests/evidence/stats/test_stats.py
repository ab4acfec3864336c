"""Error bars: every statistic against scipy/numpy or a hand computation written in the docstring.

Tolerances: rel 1e-12 against scipy's and numpy's closed forms (ttest_ind, t.interval, the textbook clustered
SE by explicit loops: float64 round-off), rel 1e-10 where scipy's special functions or a quadrature of the
noncentral t stand on the other side (they agree to ~1e-14), and the digits shown for hand computations."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import integrate, optimize, stats

from vecmerge.evidence import EvidenceError
from vecmerge.evidence.judge.compare import compare_records
from vecmerge.evidence.ledger.ledger import Record
from vecmerge.evidence.stats.noise import pooled_noise, power_two_sample, repeats_needed
from vecmerge.evidence.stats.stats import (
    DiffResult,
    clustered_se,
    item_means,
    paired,
    summarize,
    summarize_records,
    t_interval,
    welch,
)

V51 = [1.0180, 0.9895, 1.0004, 1.0105, 1.0142]  # the user's five official runs of v51
V28 = [0.9836, 0.9890]  # and v28's two
V58 = [1.0282, 1.0234, 1.0145]
M = "official_total"


def runs(model, values, metric=M, start=0, subs=None):
    return [Record(start + i, model, None, metric, v, tuple(sorted((subs or {}).items())))
            for i, v in enumerate(values)]


def items(model, scores, clusters=None, metric="toy/acc"):
    clusters = clusters or {}
    return [Record(1000 + i, model, None, metric, v, item=k, cluster=clusters.get(k))
            for i, (k, v) in enumerate(scores.items())]


def test_v51_vs_v28_welch_by_hand_and_scipy():
    """The user's v51 (5 runs) against v28 (2 runs), Welch's t, worked by hand:

    v51: mean = (1.0180 + 0.9895 + 1.0004 + 1.0105 + 1.0142) / 5 = 5.0326 / 5 = 1.00652
         deviations +0.01148, -0.01702, -0.00612, +0.00398, +0.00768
         squares 1.317904e-4, 2.896804e-4, 3.74544e-5, 1.58404e-5, 5.89824e-5; sum = 5.33748e-4
         s² = 5.33748e-4 / 4 = 1.33437e-4,  s = 0.0115515,  s²/n = 2.668740e-5
    v28: mean = (0.9836 + 0.9890) / 2 = 0.9863, deviations ±0.0027
         s² = 2 · 0.0027² / 1 = 1.458e-5,  s = 0.0038184,  s²/n = 7.29e-6
    Δ  = 1.00652 - 0.9863 = 0.02022
    SE = sqrt(2.668740e-5 + 7.29e-6) = sqrt(3.397740e-5) = 0.0058290
    t  = 0.02022 / 0.0058290 = 3.4689
    ν  = (3.397740e-5)² / ((2.668740e-5)²/4 + (7.29e-6)²/1)
       = 1.154464e-9 / (1.780543e-10 + 5.31441e-11) = 1.154464e-9 / 2.311984e-10 = 4.9934
    t_{0.975, 4.9934} = 2.5716 (between the table's 2.5706 at ν=5 and 2.7764 at ν=4, near 5)
    95% CI = 0.02022 ± 2.5716 · 0.0058290 = 0.02022 ± 0.014990 = [0.00523, 0.03521]
    p = 2 · P(T_4.9934 > 3.4689) = 0.0179  -> v51 is better beyond eval noise (CI excludes 0).
    """
    w = welch(V51, V28)
    hand = dict(diff=0.02022, se=0.0058290, t=3.4689, df=4.9934, ci_low=0.00523, ci_high=0.03521, p=0.0179)
    for key, value in hand.items():
        assert getattr(w, key) == pytest.approx(value, abs=6e-5 if key in ("t", "df", "p") else 6e-6), key
    ref = stats.ttest_ind(V51, V28, equal_var=False)
    ci = ref.confidence_interval(0.95)
    assert (w.t, w.p, w.df) == pytest.approx((ref.statistic, ref.pvalue, ref.df), rel=1e-12)
    assert (w.ci_low, w.ci_high) == pytest.approx((ci.low, ci.high), rel=1e-12)
    assert w.beyond_noise and w.n == (5, 2)
    d = w.to_dict()  # what `vecmerge evidence compare --json` prints
    assert d["beyond_noise"] is True and d["n"] == [5, 2] and (d["kind"], d["p"]) == ("welch", w.p)
    c = compare_records("v51", "v28", runs("v51", V51) + runs("v28", V28, start=10), higher_is_better=True)
    assert c.verdict == "v51 is better beyond eval noise" and c.decided_by == "welch"


def test_summary_against_numpy_and_scipy():
    s = summarize(V51, model="v51", metric=M)
    a = np.array(V51)
    lo, hi = stats.t.interval(0.95, 4, loc=a.mean(), scale=stats.sem(a))
    assert s.n == 5 and s.mean == pytest.approx(a.mean(), rel=1e-14)
    assert (s.std, s.se) == pytest.approx((a.std(ddof=1), stats.sem(a)), rel=1e-12)
    assert (s.ci_low, s.ci_high) == pytest.approx((lo, hi), rel=1e-12)
    assert (s.min, s.max, s.range) == (0.9895, 1.0180, pytest.approx(0.0285, abs=1e-12))  # the user's "range 0.0285"
    assert s.mean == pytest.approx(1.00652, abs=1e-12) and not s.single_run  # the user's "mean 1.00652"
    one = summarize([0.9944], model="v59")
    assert one.single_run and one.std is None and one.se is None and one.ci_low is None and one.range == 0.0
    s90 = summarize(V51, confidence=0.90)
    assert (s90.ci_low, s90.ci_high) == pytest.approx(stats.t.interval(0.90, 4, loc=a.mean(), scale=stats.sem(a)))
    with pytest.raises(EvidenceError, match="no values"):
        summarize([])


def test_summaries_per_model_and_sub_score():
    recs = runs("v58", V58[1:], subs={"item_understanding": 0.2453}) + runs("v58", V58[:1], start=5)
    recs += runs("v59", [0.9944], start=9) + items("v59", {"d1": 1.0})
    out = summarize_records(recs)
    assert [(s.model, s.sub, s.n, s.single_run) for s in out] == [
        ("v58", None, 3, False), ("v58", "item_understanding", 2, False), ("v59", None, 1, True)]
    assert out[0].mean == pytest.approx(np.mean(V58), rel=1e-14)
    assert out[1].std == 0.0
    assert [s.metric for s in out] == [M, M, M]
    subs = runs("v58", V58, subs={"item_understanding": 0.2}) + runs("v58", [0.5, 0.1], start=5,
                                                                     subs={"item_understanding": 0.3})
    whole, sub = summarize_records(subs, confidence=0.80)
    values = [0.2, 0.2, 0.2, 0.3, 0.3]
    ref = stats.t.interval(0.80, 4, loc=np.mean(values), scale=stats.sem(values))
    assert (sub.sub, sub.metric, sub.confidence) == ("item_understanding", M, 0.80) and whole.confidence == 0.80
    assert (sub.ci_low, sub.ci_high) == pytest.approx(ref, rel=1e-12)


def test_differences_that_do_not_vary_give_no_test():
    """Every item A - B the same (SE = 0, clustered or not): no t statistic can be formed, so no test."""
    a = {f"d{i}": 0.5 + i / 8 for i in range(6)}  # binary fractions: every difference is exactly 0.25
    b = {k: v - 0.25 for k, v in a.items()}
    assert paired(a, b, {k: f"c{i % 2}" for i, k in enumerate(a)}) == (None, None)


def test_paired_against_scipy_ttest_rel():
    rng = np.random.default_rng(0)
    a = rng.normal(0.6, 0.2, 40)
    b = a - 0.05 + rng.normal(0, 0.05, 40)
    ia = {f"d{i}": float(x) for i, x in enumerate(a)}
    ib = {f"d{i}": float(x) for i, x in enumerate(b)}
    ib["extra"] = 1.0  # only B scored it: not paired
    iid, clustered = paired(ia, ib)
    ref = stats.ttest_rel(a, b)
    ci = ref.confidence_interval(0.95)
    assert clustered is None and iid.n == (40,) and iid.df == 39
    assert (iid.t, iid.p, iid.ci_low, iid.ci_high) == pytest.approx((ref.statistic, ref.pvalue, ci.low, ci.high),
                                                                    rel=1e-10)
    assert paired({"x": 1.0}, {"x": 0.0}) == (None, None)  # one common item: no test


def test_clustered_se_against_millers_double_sum():
    """Miller (2024): SE_C² = SE_CLT² + (1/n²) Σ_c Σ_i Σ_{j≠i} (d_i - d̄)(d_j - d̄) (i, j in the same cluster c),
    SE_CLT² = s²/n with s² the sample variance. Computed here by explicit loops, independently of clustered_se."""
    rng = np.random.default_rng(1)
    keys = [f"c{k}" for k in rng.integers(0, 6, 30)]
    d = rng.normal(0.02, 0.1, 30)
    mean, n = d.mean(), len(d)
    clt2 = np.var(d, ddof=1) / n
    cross = sum((d[i] - mean) * (d[j] - mean) for i in range(n) for j in range(n)
                if i != j and keys[i] == keys[j]) / n**2
    assert clustered_se(list(d), keys) == pytest.approx(math.sqrt(clt2 + cross), rel=1e-12)
    # one item per cluster: no cross terms, the clustered SE is the paired (iid) SE exactly
    assert clustered_se(list(d), range(n)) == pytest.approx(stats.sem(d), rel=1e-12)


def test_clustered_errors_are_wider_for_correlated_items_and_decide():
    """Items in 4 topics, whole topics moving together: the clustered SE exceeds the iid one and the
    verdict rests on the clustered test (ν = C - 1 = 3)."""
    topics = {f"d{i}": f"t{i % 4}" for i in range(24)}
    shift = {"t0": 0.3, "t1": 0.05, "t2": 0.25, "t3": 0.0}
    a = {k: 0.5 + shift[t] + 0.01 * (int(k[1:]) % 3) for k, t in topics.items()}
    b = {k: 0.5 for k in topics}
    recs = items("A", a, topics) + items("B", b, topics)
    c = compare_records("A", "B", recs, higher_is_better=True)
    assert c.decided_by == "clustered" and c.clustered.clusters == 4 and c.clustered.df == 3
    assert c.clustered.se > 2 * c.paired.se
    assert c.paired.beyond_noise and not c.clustered.beyond_noise
    assert c.verdict_code == "within_noise"


def test_pooled_noise_by_hand():
    """v51: Σ(x-x̄)² = 5.33748e-4 (4 df); v28: 1.458e-5 (1 df); v59 has one run and is left out.
    s_p² = (5.33748e-4 + 1.458e-5) / 5 = 1.096656e-4, s_p = 0.0104721."""
    p = pooled_noise({"v51": V51, "v28": V28, "v59": [0.9944]})
    assert p.models == ("v51", "v28") and p.df == 5
    assert p.var == pytest.approx(1.096656e-4, rel=1e-9) and p.sd == pytest.approx(0.0104721, abs=1e-7)
    assert pooled_noise({"v59": [0.9944]}) is None


@pytest.mark.parametrize("d, n", [(0.5, 64), (0.8, 26), (1.0, 17)])
def test_repeats_needed_matches_cohens_table(d, n):
    """Cohen (1988), Table 2.4.1: two-sided α = 0.05, power 0.80, effect size d = δ/σ: n per group
    64 (d=0.5), 26 (d=0.8), 17 (d=1.0). The answer is the smallest such n."""
    assert repeats_needed(d * 0.01, 0.01) == n
    assert power_two_sample(n, d, 1.0) >= 0.8 > power_two_sample(n - 1, d, 1.0)


def test_power_against_a_simulation():
    """Monte Carlo: 4000 seeded two-sample experiments with n=6, δ=1.2σ; the share rejected at 0.05
    must match the noncentral-t power within 3 standard errors of a proportion."""
    rng = np.random.default_rng(2)
    a = rng.normal(1.2, 1.0, (4000, 6))
    b = rng.normal(0.0, 1.0, (4000, 6))
    share = float(np.mean(stats.ttest_ind(a, b, axis=1).pvalue < 0.05))
    exact = power_two_sample(6, 1.2, 1.0)
    assert share == pytest.approx(exact, abs=3 * math.sqrt(exact * (1 - exact) / 4000))
    assert repeats_needed(0.0, 1.0) is None
    with pytest.raises(EvidenceError, match="noise must be > 0"):
        repeats_needed(0.1, 0.0)


def test_compare_verdicts_follow_the_direction_and_the_evidence():
    base = runs("v51", V51) + runs("v28", V28, start=10)
    assert compare_records("v28", "v51", base, higher_is_better=True).verdict == "v51 is better beyond eval noise"
    lower = compare_records("v51", "v28", base, higher_is_better=False)  # e.g. a loss: lower is better
    assert lower.verdict_code == "b_better" and lower.verdict == "v28 is better beyond eval noise"
    unknown = compare_records("v51", "v28", base)
    assert unknown.verdict_code == "a_higher" and "no direction recorded" in unknown.verdict
    near = runs("v58", V58) + runs("v51", V51, start=10)
    within = compare_records("v58", "v51", near, higher_is_better=True)
    ref = stats.ttest_ind(V58, V51, equal_var=False)
    assert within.welch.p == pytest.approx(ref.pvalue, rel=1e-12) and ref.pvalue > 0.05
    assert within.verdict == "within noise"


def test_a_single_run_is_not_enough_and_the_repeats_needed_are_shown():
    """v59's one run (0.9944) against v58's three: no Welch test is possible. The pooled noise of the
    ledger (v58, v51, v28) sizes the experiment that would settle it."""
    recs = runs("v59", [0.9944]) + runs("v58", V58, start=10) + runs("v51", V51, start=20) + runs("v28", V28, start=30)
    c = compare_records("v59", "v58", recs, higher_is_better=True)
    assert c.verdict == "not enough runs" and c.decided_by is None and c.welch is None
    assert "v59 1" in c.reasons[0]
    pooled = pooled_noise({"v58": V58, "v51": V51, "v28": V28})
    assert c.pooled == pooled and c.noise_sd == pooled.sd
    assert c.detect == pytest.approx(abs(0.9944 - np.mean(V58)), rel=1e-12)
    assert c.repeats_needed == repeats_needed(c.detect, pooled.sd)
    assert power_two_sample(c.repeats_needed, c.detect, pooled.sd) >= 0.8
    d = c.to_dict()
    assert d["verdict"] == "not enough runs" and d["pooled"]["models"] == ["v58", "v51", "v28"]


def test_identical_runs_give_no_welch_test():
    c = compare_records("A", "B", runs("A", [0.5, 0.5]) + runs("B", [0.4, 0.4], start=5), higher_is_better=True)
    assert c.welch is None and c.verdict_code == "not_enough_runs" and "do not vary" in c.reasons[0]


def test_paired_items_decide_before_runs():
    rng = np.random.default_rng(3)
    a = {f"d{i}": float(x) for i, x in enumerate(rng.integers(0, 2, 200))}
    b = {k: (v if i % 10 else 0.0) for i, (k, v) in enumerate(a.items())}  # A better on some items
    recs = items("A", a) + items("B", b) + runs("A", [0.70]) + runs("B", [0.69], start=50)
    c = compare_records("A", "B", recs, metric="toy/acc", higher_is_better=True)
    # 0/1 items: McNemar, the exact binomial on the discordant items (few of them); the interval stays the paired t's
    n10 = sum(a[k] == 1 and b[k] == 0 for k in a)
    n01 = sum(a[k] == 0 and b[k] == 1 for k in a)
    ref = stats.binomtest(n10, n10 + n01, 0.5)
    assert n10 + n01 < 25 and c.paired.method == "McNemar exact binomial" and c.paired.discordant == (n10, n01)
    assert c.decided_by == "paired" and c.paired.p == pytest.approx(ref.pvalue, rel=1e-10)
    tref = stats.ttest_rel(list(a.values()), list(b.values()))
    assert (c.paired.ci_low, c.paired.ci_high) == pytest.approx(tuple(tref.confidence_interval(0.95)), rel=1e-10)
    assert c.verdict_code == ("a_better" if ref.pvalue < 0.05 else "within_noise")
    with pytest.raises(EvidenceError, match="several metrics"):
        compare_records("A", "B", recs + runs("A", [1.0], metric="other", start=90))


def test_conflicting_cluster_keys_are_refused():
    with pytest.raises(EvidenceError, match="item 'd1': cluster 'x' for A but 'y' for B"):
        compare_records("A", "B", items("A", {"d1": 1.0, "d2": 0.0}, {"d1": "x"}) + items("B", {"d1": 0.0, "d2": 0.0},
                                                                                 {"d1": "y"}))


def _power_by_integration(n, delta, sd, alpha):
    """The two-sided two-sample t test's power from the definition of the noncentral t, by quadrature:
    T = (Z + λ) / sqrt(V/ν), Z ~ N(0, 1), V ~ χ²_ν, ν = 2n - 2, λ = δ / (σ·sqrt(2/n)), c = t_{1-α/2, ν}:
    P(|T| > c) = ∫ [P(Z > c·sqrt(v/ν) - λ) + P(Z < -c·sqrt(v/ν) - λ)] f_{χ²_ν}(v) dv."""
    nu = 2 * n - 2
    lam = delta / (sd * math.sqrt(2 / n))
    c = stats.t.ppf(1 - alpha / 2, nu)

    def integrand(v):
        r = c * math.sqrt(v / nu)
        return (stats.norm.sf(r - lam) + stats.norm.cdf(-r - lam)) * stats.chi2.pdf(v, nu)

    # over the χ²_ν quantiles 1e-16 .. 1 - 1e-16 (the mass left out is below 2e-16)
    lo, hi = stats.chi2.ppf(1e-16, nu), stats.chi2.isf(1e-16, nu)
    return integrate.quad(integrand, lo, hi, epsabs=1e-13, epsrel=1e-12, limit=200)[0]


@pytest.mark.parametrize("n, delta, sd, alpha", [(6, 1.2, 1.0, 0.05), (3, -0.7, 0.5, 0.10), (26, 0.8, 1.0, 0.05),
                                                 (64, 0.005, 0.01, 0.01), (2, 3.0, 1.0, 0.20), (9, 0.0, 2.0, 0.05),
                                                 (400, 0.8, 1.0, 0.05), (3000, -0.8, 1.0, 0.05)])
def test_power_equals_the_noncentral_t_integral(n, delta, sd, alpha):
    """power_two_sample against the quadrature of the noncentral t's definition (rel 1e-10; the two agree to
    ~1e-14 here), both tails counted: with δ = 0 the power is the test's size α; a difference of either
    sign has the same power; the default α is 0.05."""
    assert power_two_sample(n, delta, sd, alpha) == pytest.approx(_power_by_integration(n, delta, sd, alpha),
                                                                  rel=1e-10)
    assert power_two_sample(n, -delta, sd, alpha) == pytest.approx(power_two_sample(n, delta, sd, alpha), rel=1e-10)
    assert power_two_sample(n, 0.0, sd, alpha) == pytest.approx(alpha, rel=1e-10)
    assert power_two_sample(n, delta, sd) == pytest.approx(_power_by_integration(n, delta, sd, 0.05), rel=1e-10)


@pytest.mark.parametrize("delta, sd, alpha, power", [(0.5, 1.0, 0.05, 0.8), (0.03, 0.01, 0.05, 0.8),
                                                     (-0.2, 0.1, 0.10, 0.9), (0.8, 1.0, 0.01, 0.95),
                                                     (1.0, 0.1, 0.05, 0.8), (0.1, 1.0, 0.05, 0.06),
                                                     (0.1, 1.0, 0.20, 0.3)])
def test_repeats_needed_is_the_fewest_runs_and_max_n_is_inclusive(delta, sd, alpha, power):
    """The fewest n ≥ 2 whose power (by quadrature, independent of noise.py; power grows with n) reaches the
    target: n reaches it and n - 1 does not; the same n with max_n = n (the bound is inclusive), None with
    max_n = n - 1."""
    n = repeats_needed(delta, sd, alpha=alpha, power=power)
    assert _power_by_integration(n, delta, sd, alpha) >= power
    assert n == 2 or _power_by_integration(n - 1, delta, sd, alpha) < power
    assert repeats_needed(delta, sd, alpha=alpha, power=power, max_n=n) == n
    if n > 2:
        assert repeats_needed(delta, sd, alpha=alpha, power=power, max_n=n - 1) is None
    if (alpha, power) == (0.05, 0.8):
        assert repeats_needed(delta, sd) == n  # the defaults are α = 0.05, power 0.80


def test_a_power_reached_exactly_is_reached():
    """A target equal to the power of n runs (to the last bit) needs exactly n runs: the rule is power ≥ target,
    also when max_n = n."""
    target = power_two_sample(17, 1.0, 1.0)
    assert power_two_sample(16, 1.0, 1.0) < target
    assert repeats_needed(1.0, 1.0, power=target) == 17
    assert repeats_needed(1.0, 1.0, power=target, max_n=17) == 17


def test_repeats_needed_refuses_beyond_the_default_max_n():
    """The default max_n is 100 000 runs: a difference that needs 100 001 (power_two_sample's own 0.80
    crossing, found by root finding) gives None, and 100 001 once max_n allows it."""
    root = optimize.brentq(lambda d: power_two_sample(100_001, d, 1.0) - 0.8, 0.01, 0.02, xtol=1e-15)
    delta = root * (1 + 1e-9)
    assert power_two_sample(100_000, delta, 1.0) < 0.8 <= power_two_sample(100_001, delta, 1.0)
    assert repeats_needed(delta, 1.0) is None
    assert repeats_needed(delta, 1.0, max_n=100_001) == 100_001


def test_t_interval_and_every_default_confidence_against_scipy():
    """t_interval, summarize, summarize_records, welch and paired at their default confidence give scipy's 95%
    Student-t intervals (rel 1e-12); an explicit 0.80 gives scipy's 80% one."""
    assert t_interval(0.3, 0.02, 7) == pytest.approx(stats.t.interval(0.95, 7, loc=0.3, scale=0.02), rel=1e-12)
    assert t_interval(0.3, 0.02, 7, 0.80) == pytest.approx(stats.t.interval(0.80, 7, loc=0.3, scale=0.02), rel=1e-12)
    a = np.array(V51)
    ref = stats.t.interval(0.95, 4, loc=a.mean(), scale=stats.sem(a))
    s = summarize_records(runs("v51", V51))[0]
    assert s.confidence == 0.95 and (s.ci_low, s.ci_high) == pytest.approx(ref, rel=1e-12)
    assert summarize(V51).confidence == 0.95
    s80 = summarize_records(runs("v51", V51), confidence=0.80)[0]
    assert (s80.ci_low, s80.ci_high) == pytest.approx(stats.t.interval(0.80, 4, loc=a.mean(), scale=stats.sem(a)),
                                                      rel=1e-12)
    w80 = welch(V51, V28, confidence=0.80)
    assert (w80.ci_low, w80.ci_high) == pytest.approx(
        stats.ttest_ind(V51, V28, equal_var=False).confidence_interval(0.80), rel=1e-12)


def test_clustered_test_with_singletons_against_the_textbook_formula():
    """Items of 3 named clusters plus 4 items without a key (each its own cluster, so C = 7): SE_C from Miller's
    double sum by explicit loops, ν = C - 1, t = Δ/SE_C, p = 2·P(T_ν > |t|), CI = Δ ± t_{0.975,ν}·SE_C (rel 1e-12).
    Cluster keys of items only one model scored do not count; one cluster (or none among the common items)
    gives no clustered test; the iid paired test is scipy's ttest_rel."""
    rng = np.random.default_rng(4)
    ids = [f"d{i}" for i in range(16)]
    a = {k: float(x) for k, x in zip(ids, rng.normal(0.6, 0.2, 16))}
    b = {k: a[k] - float(x) for k, x in zip(ids, rng.normal(0.04, 0.1, 16))}
    keys = {k: f"c{i % 3}" for i, k in enumerate(ids[:12])}  # d12..d15 have no cluster
    b["only_b"] = 0.0
    keys["only_b"] = "c9"  # not a common item: its cluster does not exist for the test
    iid, cl = paired(a, b, keys)
    common = sorted(ids)
    d = np.array([a[k] - b[k] for k in common])
    group = [keys.get(k, k) for k in common]
    n, mean = len(d), d.mean()
    cross = sum((d[i] - mean) * (d[j] - mean) for i in range(n) for j in range(n) if i != j and group[i] == group[j])
    se = math.sqrt(np.var(d, ddof=1) / n + cross / n**2)
    nu = 7 - 1
    t = mean / se
    q = stats.t.ppf(0.975, nu)
    assert cl.kind == "clustered" and cl.clusters == 7 and cl.df == nu and cl.n == (16,)
    assert (cl.diff, cl.se, cl.t, cl.p) == pytest.approx((mean, se, t, 2 * stats.t.sf(abs(t), nu)), rel=1e-12)
    assert (cl.ci_low, cl.ci_high) == pytest.approx((mean - q * se, mean + q * se), rel=1e-12)
    ref = stats.ttest_rel([a[k] for k in common], [b[k] for k in common])
    assert iid.kind == "paired" and (iid.t, iid.p) == pytest.approx((ref.statistic, ref.pvalue), rel=1e-10)
    two = paired(a, b, {k: ("x" if i < 8 else "y") for i, k in enumerate(ids)})[1]
    assert two.clusters == 2 and two.df == 1
    assert paired(a, b, {k: "x" for k in ids})[1] is None  # one cluster: ν would be 0
    assert paired(a, b, {"only_b": "c9"})[1] is None and paired(a, b, {})[1] is None


def test_min_items_bounds_the_paired_test():
    """min_items common items give a test, one fewer none; fewer than 2 never (no spread to estimate)."""
    a = {"x": 0.9, "y": 0.4, "z": 0.7, "w": 0.1}
    b = {"x": 0.5, "y": 0.3, "z": 0.2}
    assert paired(a, b, min_items=3)[0].n == (3,)
    assert paired(a, b, min_items=4) == (None, None)
    assert paired(a, b)[0].df == 2
    assert paired({"x": 0.9, "y": 0.4}, {"x": 0.5, "y": 0.3})[0].df == 1  # the default asks for 2
    assert paired({"x": 0.9, "y": 0.4}, {"x": 0.5, "y": 0.3}, min_items=1)[0].n == (2,)
    assert paired({"x": 0.9}, {"x": 0.5}, min_items=1) == (None, None)


def test_an_interval_touching_zero_is_within_noise():
    """beyond_noise means the interval excludes 0: an endpoint at exactly 0 does not."""
    base = dict(kind="welch", diff=0.1, se=0.05, df=4.0, t=2.0, p=0.05, n=(5, 5))
    assert not DiffResult(ci_low=0.0, ci_high=0.2, **base).beyond_noise
    assert not DiffResult(ci_low=-0.2, ci_high=0.0, **base).beyond_noise
    assert DiffResult(ci_low=1e-12, ci_high=0.2, **base).beyond_noise
    assert DiffResult(ci_low=-0.2, ci_high=-1e-12, **base).beyond_noise


def test_the_user_sees_which_values_are_missing_and_which_item_has_two_clusters():
    with pytest.raises(EvidenceError, match=r"^v59: no values for official_total$"):
        summarize([], model="v59", metric=M)
    with pytest.raises(EvidenceError, match=r"^summary: no values for the metric$"):
        summarize([])
    recs = items("A", {"d1": 1.0, "d2": 0.0}, {"d1": "x"}) + items("A", {"d1": 0.0}, {"d1": "y"})
    with pytest.raises(EvidenceError, match=r"^item 'd1': two cluster keys \('x', 'y'\); an item belongs to one "
                                            r"cluster$"):
        item_means(recs)
    with pytest.raises(EvidenceError, match="two cluster keys"):
        compare_records("A", "B", recs + items("B", {"d1": 0.0, "d2": 0.0}))


def test_an_item_scored_several_times_counts_once_at_its_mean():
    """Repeated item records (e.g. several seeds) enter the paired test as their mean; whole-run records, before
    or after them, are not items. Against scipy's ttest_rel on the means computed with numpy (rel 1e-10)."""
    rng = np.random.default_rng(5)
    a3 = rng.normal(0.6, 0.2, (3, 12))  # three records of each of 12 items for A, one for B
    b1 = a3.mean(axis=0) - rng.normal(0.05, 0.1, 12)
    recs = runs("A", [0.61, 0.64]) + runs("B", [0.58, 0.57], start=20)
    for rep in range(3):
        recs += items("A", {f"d{i}": float(x) for i, x in enumerate(a3[rep])})
    recs += items("B", {f"d{i}": float(x) for i, x in enumerate(b1)})
    means, clusters = item_means(r for r in recs if r.model == "A")
    assert list(means) == [f"d{i}" for i in range(12)] and clusters == {}
    assert list(means.values()) == pytest.approx(a3.mean(axis=0), rel=1e-14)
    c = compare_records("A", "B", recs, metric="toy/acc", higher_is_better=True)
    ref = stats.ttest_rel(a3.mean(axis=0), b1)
    assert c.decided_by == "paired" and c.paired.n == (12,)
    assert (c.paired.t, c.paired.p) == pytest.approx((ref.statistic, ref.pvalue), rel=1e-10)


def test_spread_below_round_off_is_zero():
    """Three identical 0.092 values: std 0, no Welch test (it gave p 1.4e-57); a spread of one ulp in 0.3 is kept
    as zero too, a real spread of 1e-12 is not."""
    assert summarize([0.092] * 3).std == 0.0 and welch([0.092] * 3, [0.1226] * 3) is None
    assert summarize([0.1 + 0.2, 0.3, 0.3]).std == 0.0
    s = summarize([0.3, 0.3 + 1e-12, 0.3])
    assert s.std == pytest.approx(np.std([0.3, 0.3 + 1e-12, 0.3], ddof=1), rel=1e-3) and s.std > 0
