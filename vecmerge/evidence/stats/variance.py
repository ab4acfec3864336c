"""Variance components of repeated trainings: how much of a score's noise is the training, how much the evaluation.

One-way random effects, k trainings, training i evaluated n_i times (N = Σ n_i), method of moments:

    y_ij = μ + t_i + e_ij,   t_i ~ N(0, σ²_b),   e_ij ~ N(0, σ²_w)
    MSB = Σ_i n_i (ȳ_i - ȳ)² / (k - 1),   MSW = Σ_ij (y_ij - ȳ_i)² / (N - k)
    n0 = (N - Σ_i n_i² / N) / (k - 1),   σ̂²_w = MSW,   σ̂²_b = (MSB - MSW) / n0   (reported raw and truncated at 0)

Intervals at 1 - α: σ²_w's exact χ² interval; σ²_b's modified large-sample (MLS) interval (Ting et al. 1990;
Burdick and Graybill 1992), bounds truncated at 0, approximate for unequal n_i. Nothing separates the two
noises without two trainings and a second evaluation of one of them (ν1, ν2 ≥ 1).
The MLS formulas and their limits: docs/design/evidence.md.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .. import EvidenceError

METHOD = "one-way random-effects ANOVA, method of moments; CI: chi-square (within), MLS (between)"


@functools.lru_cache(maxsize=4096)
def _chi2(q: float, df: float) -> float:
    from scipy import stats

    return float(stats.chi2.ppf(q, df))


@functools.lru_cache(maxsize=4096)
def _f(q: float, df1: float, df2: float) -> float:
    from scipy import stats

    return float(stats.f.ppf(q, df1, df2))


@dataclass(frozen=True)
class VarianceComponents:
    """The ANOVA of one replicate group on one metric (module docstring); variances in the metric's units².

    ``var_between_training`` is σ̂²_b truncated at 0 (``var_between_training_raw`` as estimated);
    ``var_within_eval`` is σ̂²_w; ``sd_total`` = sqrt(σ̂²_b + σ̂²_w), the noise of one evaluation of a fresh
    training; the intervals are at ``confidence``. ``runs``: the evaluations of each training, in order.
    """

    group: str
    members: tuple[str, ...]
    metric: str
    env: str | None
    trainings: int
    evaluations: int
    runs: tuple[int, ...]
    n0: float
    df_between: int
    df_within: int
    ms_between: float
    ms_within: float
    var_between_training: float
    var_between_training_raw: float
    var_within_eval: float
    ci_between_training: tuple[float, float]
    ci_within_eval: tuple[float, float]
    sd_training: float
    sd_eval: float
    sd_total: float
    confidence: float
    method: str = METHOD

    def to_dict(self) -> dict:
        out = dict(self.__dict__)
        for key in ("members", "runs", "ci_between_training", "ci_within_eval"):
            out[key] = list(out[key])
        return out


def variance_components(trainings: Mapping[str, Sequence[float]], *, group: str = "", metric: str = "",
                        env: str | None = None, confidence: float = 0.95) -> VarianceComponents | None:
    """σ²_b (between trainings) and σ²_w (within evaluations) by the method of moments, with intervals.

    Hand computation (the test checks it): trainings A = [1.00, 1.02], B = [0.96, 0.98], C = [1.01, 1.03].
    Means 1.01, 0.97, 1.02, grand mean 1.00; SSB = 2 (0.01² + 0.03² + 0.02²) = 0.0028, ν1 = 2, MSB = 0.0014;
    SSW = 6 x 0.01² = 0.0006, ν2 = 3, MSW = 0.0002; n0 = (6 - 12/6) / 2 = 2. So σ̂²_w = 0.0002,
    σ̂²_b = (0.0014 - 0.0002) / 2 = 0.0006 (sd 0.0245 against the evaluations' 0.0141: a retraining moves
    this score more than a re-evaluation does). At 95%: σ²_w in [0.0006 / 9.3484, 0.0006 / 0.21580] =
    [6.4182e-05, 2.7804e-03]; σ²_b in [0, 0.027524] (MLS: L = -0.00066 truncated, U from G1 = 0.72891,
    H1 = 38.498, G2 = 0.67909, H2 = 12.902, Fu = 16.044, Fl = 0.025533).

    Args:
        trainings (Mapping[str, Sequence[float]]): each training (a workspace name) -> its evaluations'
            values; trainings without one are left out.
        group, metric, env: labels for the result. confidence (float): the intervals' coverage.

    Returns:
        VarianceComponents, or None when the two noises cannot be separated: fewer than 2 trainings with
        evaluations, or no training evaluated twice (ν2 = 0).
    """
    if not 0 < confidence < 1:
        raise EvidenceError(f"confidence={confidence!r}: between 0 and 1")
    kept = {m: [float(v) for v in vs] for m, vs in trainings.items() if len(vs)}
    k = len(kept)
    n = [len(vs) for vs in kept.values()]
    total = sum(n)
    if k < 2 or total - k < 1:
        return None
    grand = math.fsum(v for vs in kept.values() for v in vs) / total
    means = [math.fsum(vs) / len(vs) for vs in kept.values()]
    ssb = math.fsum(ni * (m - grand) ** 2 for ni, m in zip(n, means))
    ssw = math.fsum((v - m) ** 2 for vs, m in zip(kept.values(), means) for v in vs)
    v1, v2 = k - 1, total - k
    msb, msw = ssb / v1, ssw / v2
    n0 = (total - sum(ni * ni for ni in n) / total) / v1
    raw = (msb - msw) / n0
    a = 1 - confidence
    g1, h1 = 1 - v1 / _chi2(1 - a / 2, v1), v1 / _chi2(a / 2, v1) - 1
    g2, h2 = 1 - v2 / _chi2(1 - a / 2, v2), v2 / _chi2(a / 2, v2) - 1
    fu, fl = _f(1 - a / 2, v1, v2), _f(a / 2, v1, v2)
    g12 = ((fu - 1) ** 2 - g1 * g1 * fu * fu - h2 * h2) / fu
    h12 = ((1 - fl) ** 2 - h1 * h1 * fl * fl - g2 * g2) / fl
    low = raw - math.sqrt(max(g1 * g1 * msb * msb + h2 * h2 * msw * msw + g12 * msb * msw, 0.0)) / n0
    high = raw + math.sqrt(max(h1 * h1 * msb * msb + g2 * g2 * msw * msw + h12 * msb * msw, 0.0)) / n0
    between = max(raw, 0.0)
    return VarianceComponents(group, tuple(kept), metric, env, k, total, tuple(n), n0, v1, v2, msb, msw, between,
                              raw, msw, (max(low, 0.0), max(high, 0.0)),
                              (ssw / _chi2(1 - a / 2, v2), ssw / _chi2(a / 2, v2)), math.sqrt(between),
                              math.sqrt(msw), math.sqrt(between + msw), confidence)
