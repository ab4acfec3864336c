"""The anytime-valid t test behind `evidence decide`: its formula against independent computations, and its
error rates by seeded simulation with a look after every run (a few seconds in all).

Independent references: the mixture integral by scipy quadrature over noncentral t densities; the one-sample
form in sums S and V; Howard et al. 2021's two-sided normal-mixture boundary as the known-variance limit; a
naive Welch test repeated after every run, vectorized in numpy/scipy here (it shares no code with decide).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import integrate, stats

from vecmerge.evidence import EvidenceError
from vecmerge.evidence.stats.sequential import (
    CONTINUE,
    STOP_BETTER,
    STOP_FUTILE,
    decide_runs,
    mixture_boundary,
    mixture_e_value,
)

ALPHA = 0.05


@pytest.mark.parametrize("t, nu, n_eff, g", [(1.7, 3, 1.0, 1.0), (-2.5, 8, 2.5, 4.0), (0.3, 18, 5.0, 0.5),
                                             (4.0, 5, 1.4286, 1.085)])
def test_the_closed_form_is_the_mixture_integral(t, nu, n_eff, g):
    """E = ∫ f_{ν, δ sqrt(n_e)}(t) dN(δ; 0, g) / f_ν(t), integrated numerically (rel 1e-7)."""
    num, _ = integrate.quad(lambda d: stats.nct.pdf(t, nu, d * math.sqrt(n_eff)) * stats.norm.pdf(d, 0, math.sqrt(g)),
                            -np.inf, np.inf, epsabs=0, epsrel=1e-10)
    assert mixture_e_value(t, nu, n_eff, g) == pytest.approx(num / stats.t.pdf(t, nu), rel=1e-7)


def test_the_boundary_is_where_the_e_value_reaches_one_over_alpha():
    for nu, n_eff, g in [(8, 2.5, 4.0), (18, 5.0, 0.5), (40, 10.0, 1.0), (3, 1.0, 50.0)]:
        c = mixture_boundary(nu, n_eff, g, ALPHA)
        s = math.sqrt(1 + n_eff * g)
        assert math.isfinite(c)
        assert stats.t.pdf(c / s, nu) / (s * stats.t.pdf(c, nu)) == pytest.approx(1 / ALPHA, rel=1e-9)
    # 5 + 2 runs, g = 1: the supremum s^ν = 2.43^2.5 = 9.2 < 20: no finite boundary yet
    s2 = 1 + (10 / 7) * 1.0
    assert s2 ** (5 / 2) < 1 / ALPHA and mixture_boundary(5, 10 / 7, 1.0, ALPHA) == math.inf
    assert mixture_e_value(math.inf, 5, 10 / 7, 1.0) == pytest.approx(s2 ** 2.5, rel=1e-12)


def test_one_sample_form_in_sums():
    """With n_e = n, ν = n - 1, g = 1/r²: E = sqrt(r²/(n+r²)) ((n+r²)V / ((n+r²)V - S²))^(n/2) at Δ0 = 0."""
    x = np.array([0.3, 1.1, -0.2, 0.8, 0.5, 1.4])
    n, r2 = len(x), 2.0
    t = math.sqrt(n) * x.mean() / x.std(ddof=1)
    S, V = x.sum(), (x ** 2).sum()
    want = math.sqrt(r2 / (n + r2)) * ((n + r2) * V / ((n + r2) * V - S ** 2)) ** (n / 2)
    assert mixture_e_value(t, n - 1, n, 1 / r2) == pytest.approx(want, rel=1e-12)


def test_known_variance_limit_is_howards_normal_mixture_boundary():
    """As ν -> ∞, c tends to sqrt((v+ρ) log((v+ρ)/(ρα²))) / sqrt(v), v = n_e, ρ = 1/g (Howard et al. 2021, the
    two-sided normal mixture on the sum scale S_v, here divided by sqrt(v) for the z scale)."""
    for v, g in [(2.5, 1.0), (5.0, 4.0), (50.0, 0.25)]:
        rho = 1 / g
        howard = math.sqrt((v + rho) * math.log((v + rho) / (rho * ALPHA ** 2))) / math.sqrt(v)
        assert mixture_boundary(1e9, v, g, ALPHA) == pytest.approx(howard, rel=1e-6)
        assert mixture_boundary(200, v, g, ALPHA) > howard  # an unknown sd costs width


def alternate(a, b):
    return [run for pair in zip((("A", x) for x in a), (("B", y) for y in b)) for run in pair]


def simulate(delta, runs, reps, seed, min_effect=1.0):
    """Decisions of `decide_runs` over seeded normal runs (sd 1), A and B alternating, a look after every run."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(reps):
        a, b = rng.normal(delta, 1.0, runs), rng.normal(0.0, 1.0, runs)
        out.append(decide_runs(alternate(a, b), min_effect=min_effect, max_runs=runs, alpha=ALPHA))
    return out


def naive_welch_rate(runs, reps, seed):
    """The share of null sequences where a Welch test repeated after every run (once each side has 2) ever says
    "A better" (two-sided p < alpha, A ahead): vectorized over sequences."""
    rng = np.random.default_rng(seed)
    a, b = rng.normal(0, 1, (reps, runs)), rng.normal(0, 1, (reps, runs))
    ever = np.zeros(reps, dtype=bool)
    looks = [(2, 2)] + [pair for k in range(3, runs + 1) for pair in ((k, k - 1), (k, k))]  # A, B, A, B, ...
    for na, nb in looks:
        xa, xb = a[:, :na], b[:, :nb]
        va, vb = xa.var(axis=1, ddof=1) / na, xb.var(axis=1, ddof=1) / nb
        d = xa.mean(axis=1) - xb.mean(axis=1)
        df = (va + vb) ** 2 / (va ** 2 / (na - 1) + vb ** 2 / (nb - 1))
        p = 2 * stats.t.sf(np.abs(d / np.sqrt(va + vb)), df)
        ever |= (p < ALPHA) & (d > 0)
    return ever.mean()


def test_no_difference_stop_better_at_most_alpha_and_naive_welch_exceeds_it():
    """Δ = 0, up to 10 runs each, a look after every run: the plan's test stops "better" <= alpha; the same
    data peeked at with Welch after every run says "better" more than alpha (about 2x at these settings)."""
    decisions = simulate(0.0, 10, 2000, seed=1)
    rate = sum(d.decision == STOP_BETTER for d in decisions) / len(decisions)
    assert rate <= ALPHA
    assert all(d.decision in (STOP_BETTER, STOP_FUTILE) for d in decisions)  # each plan ends within its budget
    assert np.mean([len(d.looks) for d in decisions]) > 2  # many looks were taken
    naive = naive_welch_rate(10, 20000, seed=2)
    se = math.sqrt(ALPHA * (1 - ALPHA) / 20000)
    assert naive > ALPHA + 5 * se, naive  # measured about 0.09


def test_power_under_a_stated_effect():
    """Δ = 2 sd (D = 1 sd), up to 10 runs each: stop_better in at least 80% of plans (measured 0.85), most
    before the budget is spent; Δ = 1.5 sd with up to 20 runs each: at least 90% (measured 0.94)."""
    decisions = simulate(2.0, 10, 1000, seed=3)
    power = sum(d.decision == STOP_BETTER for d in decisions) / len(decisions)
    assert power >= 0.80, power
    assert np.mean([sum(d.runs) for d in decisions if d.decision == STOP_BETTER]) < 20
    decisions = simulate(1.5, 20, 500, seed=4)
    assert sum(d.decision == STOP_BETTER for d in decisions) / len(decisions) >= 0.90


def test_futility_stops_by_the_sequence_are_rare_when_a_is_better_by_d():
    """Δ = D: the sequence's upper end falls below D with probability <= alpha (budget stops aside)."""
    decisions = simulate(1.0, 12, 1000, seed=5)
    wrong = [d for d in decisions if d.decision == STOP_FUTILE and d.last.ci_high is not None
             and d.last.ci_high < 1.0]
    assert len(wrong) / len(decisions) <= ALPHA


def test_the_confidence_sequence_covers_the_difference_at_every_look():
    rng = np.random.default_rng(6)
    misses = 0
    for _ in range(1000):
        a, b = rng.normal(0.7, 2.0, 15), rng.normal(0.2, 2.0, 15)
        d = decide_runs(alternate(a, b), min_effect=100.0, max_runs=15, alpha=ALPHA)  # D huge: runs to the end
        misses += any(x.ci_low is not None and not x.ci_low <= 0.5 <= x.ci_high for x in d.looks)
    assert misses / 1000 <= ALPHA


def test_replay_looks_in_order_the_first_stop_is_final():
    runs = [("A", 1.0), ("B", 0.0), ("A", 1.1), ("B", 0.1), ("A", 0.9), ("B", -0.1), ("A", 1.05), ("B", 0.05),
            ("A", 1.02), ("B", 0.0), ("A", 0.98), ("B", 0.02), ("A", 5.0)]
    d = decide_runs([(m, v, i + 1) for i, (m, v) in enumerate(runs)], min_effect=0.5, max_runs=20)
    assert d.decision == STOP_BETTER and d.looks[-1].decision == STOP_BETTER
    assert [x.decision for x in d.looks[:-1]] == [CONTINUE] * (len(d.looks) - 1)
    assert d.looks[0].n_a == 2 and d.looks[0].n_b == 2 and d.looks[0].record_id == 4  # first look: two each
    assert d.after_stop == len(runs) - d.looks[-1].record_id  # later runs counted, not looked at
    assert d.looks[-1].ci_low > 0 and d.looks[-1].e_value >= 1 / ALPHA  # the sequence excludes 0 <=> E(0) >= 1/α
    # the same figures by hand at the stop: pooled sd and the t-mixture width
    stop = d.looks[-1]
    xa = [v for m, v in runs[:stop.record_id] if m == "A"]
    xb = [v for m, v in runs[:stop.record_id] if m == "B"]
    sp = math.sqrt((np.var(xa, ddof=1) * (len(xa) - 1) + np.var(xb, ddof=1) * (len(xb) - 1)) / (len(xa) + len(xb) - 2))
    assert stop.sd == pytest.approx(sp, rel=1e-12) and stop.diff == pytest.approx(np.mean(xa) - np.mean(xb), rel=1e-12)
    width = mixture_boundary(len(xa) + len(xb) - 2, len(xa) * len(xb) / (len(xa) + len(xb)), 1.0, ALPHA) * sp * \
        math.sqrt(1 / len(xa) + 1 / len(xb))
    assert stop.ci_low == pytest.approx(stop.diff - width, rel=1e-12)


def test_budget_direction_zero_variance_and_runs_past_the_maximum():
    flat = [("A", 0.2453), ("B", 0.2453)] * 6  # the same grade every run: the difference is exactly 0, sd 0
    d = decide_runs(flat, min_effect=0.0307, max_runs=6)
    assert d.decision == STOP_FUTILE and d.last.ci_low == d.last.ci_high == 0.0 and d.runs == (4, 4)
    assert [x.ci_low for x in d.looks[:-1]] == [None] * (len(d.looks) - 1)  # unbounded until 4 + 4 runs
    lower = alternate([0.30, 0.31, 0.29, 0.30, 0.31], [0.50, 0.51, 0.49, 0.52, 0.50])  # a loss: lower is better
    assert decide_runs(lower, min_effect=0.05, max_runs=5, higher_is_better=False).decision == STOP_BETTER
    assert decide_runs(lower, min_effect=0.05, max_runs=5, higher_is_better=True).decision == STOP_FUTILE
    noisy = [("A", 1.0), ("B", 0.9), ("A", 0.7), ("B", 1.2), ("A", 1.1), ("A", 9.0), ("B", 0.2)]
    d = decide_runs(noisy, min_effect=0.1, max_runs=2)
    assert d.decision == STOP_FUTILE and "budget is spent" in d.reason and d.runs == (2, 2)
    assert d.after_stop + d.beyond_max == 3


def test_continue_estimates_the_runs_that_would_decide():
    """v51's five published runs against v28's two, D = 0.01: no finite sequence yet (s^ν < 1/α), and about five
    more runs of each would end the plan if the estimates held: check it by rebuilding those runs."""
    v51, v28 = [1.0180, 0.9895, 1.0004, 1.0105, 1.0142], [0.9836, 0.9890]
    d = decide_runs([("v51", x) for x in v51] + [("v28", x) for x in v28], a="v51", b="v28", min_effect=0.01,
                    max_runs=10, prior_scale=1.0)
    assert d.decision == CONTINUE and d.more_runs == 5 and d.looks[0].ci_low is None
    k, last = d.more_runs, d.looks[-1]
    for extra in (k - 1, k):
        na, nb = 5 + extra, 2 + extra
        c = mixture_boundary(na + nb - 2, na * nb / (na + nb), 1.0, ALPHA)
        assert (c * last.sd * math.sqrt(1 / na + 1 / nb) < last.diff) == (extra == k)


def test_bad_parameters_are_refused():
    with pytest.raises(EvidenceError, match="min_effect"):
        decide_runs([], min_effect=0.0, max_runs=5)
    with pytest.raises(EvidenceError, match="not of A or B"):
        decide_runs([("C", 1.0)], min_effect=1.0, max_runs=5)
    assert decide_runs([("A", 1.0)], min_effect=1.0, max_runs=5).decision == CONTINUE
