"""Error bars for evaluations: summaries of repeated runs, and the tests of a difference A - B.

The plain, well-known statistics (Evan Miller, "Adding Error Bars to Evals", 2024, is the anchor):

    mean        x̄ = Σ x_i / n
    std         s = sqrt(Σ (x_i - x̄)² / (n - 1))                 (sample, ddof=1); 0 when s ≤ 4 n ε max|x_i|
                (round-off of the mean: three runs of 0.092 give s 1.7e-17, which is no spread)
    SE          s / sqrt(n)
    CI          x̄ ± t_{1-α/2, n-1} · SE                           (Student t, α = 1 - confidence)
    Welch       Δ = x̄_A - x̄_B,  SE = sqrt(s_A²/n_A + s_B²/n_B),
                ν = SE⁴ / ((s_A²/n_A)²/(n_A-1) + (s_B²/n_B)²/(n_B-1)),  t = Δ/SE,  p = 2·P(T_ν > |t|)
    paired      d_i = ā_i - b̄_i over the items both models scored (ā_i: the mean of A's records of item i),
                Δ = d̄, SE = s_d / sqrt(n), ν = n - 1
    McNemar     paired items all scored 0 or 1: n10 items only A got right, n01 only B; p is the exact two-sided
                binomial test of n10 of n10 + n01 at 1/2 when n10 + n01 < 25, else the chi-square
                (|n10 - n01| - 1)² / (n10 + n01) on 1 df; Δ, SE and the interval stay the paired t's; the
                verdict rests on p (``DiffResult.alpha``)
    clustered   SE_C² = SE_CLT² + (1/n²) Σ_c Σ_{i∈c} Σ_{j∈c, j≠i} (d_i - d̄)(d_j - d̄),  SE_CLT² = s_d²/n,
                ν = C - 1 (Miller 2024, "clustered standard errors"; an item without a cluster key is its
                own cluster, so with no clusters SE_C is the paired SE exactly)

The clustered formula is Miller's as the paper writes it, ``SE_clustered = sqrt(SE_CLT² + (1/n²)
Σ_c Σ_i Σ_{j≠i} (s_{i,c} - s̄)(s_{j,c} - s̄))`` (checked against the formula as quoted from arXiv 2411.00640;
the paper's PDF was not reachable from here), with ``SE_CLT`` from the sample variance.

``noise.py`` holds the ledger's pooled noise and the repeats a difference needs; ``compare.py`` the
verdict built on these tests. Everything is scipy on plain floats; records come from ``Ledger.records``.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace

from .. import EvidenceError
from ..ledger.ledger import Record


def _t():
    from scipy import stats

    return stats.t


def t_interval(mean: float, se: float, df: float, confidence: float = 0.95) -> tuple[float, float]:
    """``mean ± t_{(1+confidence)/2, df} · se``: a two-sided Student-t interval."""
    q = float(_t().ppf(0.5 + confidence / 2, df))
    return mean - q * se, mean + q * se


@dataclass(frozen=True)
class Summary:
    """n, mean, sample std, SE, t interval, min, max, range of one model's runs (or of one sub-score).

    ``std``, ``se``, ``ci_low`` and ``ci_high`` are None for a single run (``single_run`` is True). ``env``: the
    id of the eval environment the runs were measured under (``environment.py``), when known. ``harness_se``:
    the standard error the harness reported (lm-eval's ``*_stderr``: over items, within a run), the mean over
    the runs that carry one; shown beside vecmerge's SE (over runs), never used in its place.
    """

    model: str
    metric: str
    sub: str | None
    n: int
    mean: float
    std: float | None
    se: float | None
    ci_low: float | None
    ci_high: float | None
    min: float
    max: float
    range: float
    single_run: bool
    confidence: float = 0.95
    env: str | None = None
    harness_se: float | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def round_off(values: Sequence[float]) -> float:
    """``4 n ε max|x_i|``: a spread this small is the float round-off of a mean of ``values``, not noise."""
    return 4 * len(values) * sys.float_info.epsilon * max((abs(x) for x in values), default=0.0)


def summarize(values: Sequence[float], *, model: str = "", metric: str = "", sub: str | None = None,
              confidence: float = 0.95, env: str | None = None) -> Summary:
    """Summary of repeated scores (formulas in the module docstring).

    Args:
        values (Sequence[float]): n ≥ 1 scores.
        confidence (float): the interval's coverage, e.g. 0.95.
    """
    xs = [float(v) for v in values]
    n = len(xs)
    if n == 0:
        raise EvidenceError(f"{model or 'summary'}: no values for {metric or 'the metric'}")
    mean = math.fsum(xs) / n
    std = se = lo = hi = None
    if n >= 2:
        std = math.sqrt(math.fsum((x - mean) ** 2 for x in xs) / (n - 1))
        if std <= round_off(xs):
            std = 0.0
        se = std / math.sqrt(n)
        lo, hi = t_interval(mean, se, n - 1, confidence)
    return Summary(model, metric, sub, n, mean, std, se, lo, hi, min(xs), max(xs), max(xs) - min(xs), n == 1,
                   confidence, env)


def harness_se(records: Iterable[Record]) -> float | None:
    """The mean of the whole-run records' reported standard errors (lm-eval's ``*_stderr``), None without any."""
    errs = [r.stderr for r in records if not r.is_item and r.stderr is not None]
    return math.fsum(errs) / len(errs) if errs else None


def runs_by_model(records: Iterable[Record]) -> dict[str, list[float]]:
    """Whole-run values (item-level records left out) per model, in record order."""
    out: dict[str, list[float]] = {}
    for r in records:
        if not r.is_item:
            out.setdefault(r.model, []).append(r.value)
    return out


def summarize_records(records: Iterable[Record], *, confidence: float = 0.95) -> list[Summary]:
    """One Summary per (model, metric, eval environment) over whole-run records, then one per sub-score, in
    record order: records of different environments are never pooled (each Summary carries its ``env`` id)."""
    groups: dict[tuple[str, str, str], list[Record]] = {}
    for r in records:
        if not r.is_item:
            groups.setdefault((r.model, r.metric, r.environment.id), []).append(r)
    out = []
    for (model, metric, env), recs in groups.items():
        out.append(replace(summarize([r.value for r in recs], model=model, metric=metric, confidence=confidence,
                                     env=env), harness_se=harness_se(recs)))
        keys = sorted({k for r in recs for k, _ in r.subs})
        for key in keys:
            vals = [dict(r.subs)[key] for r in recs if key in dict(r.subs)]
            out.append(summarize(vals, model=model, metric=metric, sub=key, confidence=confidence, env=env))
    return out


@dataclass(frozen=True)
class DiffResult:
    """A difference A - B with its standard error, t statistic, p-value and t interval.

    kind: ``welch`` (repeated runs), ``paired`` (per item) or ``clustered`` (per item, clustered SE).
    n: runs of A and B for Welch; items for paired/clustered. clusters: the cluster count (clustered only).
    method: how p was computed when not from t (``McNemar exact binomial`` / ``McNemar chi-square``);
    discordant: (n10, n01) for McNemar; alpha: set when the verdict rests on ``p < alpha``, not on the interval.
    """

    kind: str
    diff: float
    se: float
    df: float
    t: float
    p: float
    ci_low: float
    ci_high: float
    n: tuple[int, ...]
    clusters: int | None = None
    method: str = "t"
    discordant: tuple[int, int] | None = None
    alpha: float | None = None

    @property
    def beyond_noise(self) -> bool:
        """True when the interval excludes 0 (equivalently p < 1 - confidence); McNemar: when p < alpha."""
        if self.alpha is not None:
            return self.p < self.alpha
        return self.ci_low > 0 or self.ci_high < 0

    def to_dict(self) -> dict:
        return {**asdict(self), "n": list(self.n), "beyond_noise": self.beyond_noise,
                "discordant": None if self.discordant is None else list(self.discordant)}


def difference_test(kind: str, diff: float, se: float, df: float, n: tuple[int, ...], confidence: float,
                    clusters: int | None = None) -> DiffResult | None:
    """The t test of a difference ``diff`` with standard error ``se`` on ``df`` degrees of freedom:
    t = diff / se, p = 2·P(T_df > |t|), the interval ``t_interval(diff, se, df, confidence)``; None when
    ``se`` or ``df`` is not > 0 (no spread: noise cannot be estimated)."""
    if not se > 0 or not df > 0:
        return None  # no spread: noise cannot be estimated from these values
    t = diff / se
    p = float(2 * _t().sf(abs(t), df))
    lo, hi = t_interval(diff, se, df, confidence)
    return DiffResult(kind, diff, se, float(df), t, p, lo, hi, tuple(n), clusters)


def welch(a: Sequence[float], b: Sequence[float], confidence: float = 0.95) -> DiffResult | None:
    """Welch's unequal-variance t comparison of two models' repeated runs (module docstring formulas).

    Returns None when either has fewer than 2 runs, or neither varies (SE = 0).
    """
    if len(a) < 2 or len(b) < 2:
        return None
    sa, sb = summarize(a), summarize(b)
    qa, qb = sa.std**2 / sa.n, sb.std**2 / sb.n
    se2 = qa + qb
    df = se2**2 / (qa**2 / (sa.n - 1) + qb**2 / (sb.n - 1)) if se2 > 0 else 0.0
    return difference_test("welch", sa.mean - sb.mean, math.sqrt(se2), df, (sa.n, sb.n), confidence)


def clustered_se(d: Sequence[float], clusters: Sequence) -> float:
    """Miller's clustered standard error of the mean of ``d``:

    SE_C² = s²/n + (1/n²) Σ_c Σ_{i≠j ∈ c} (d_i - d̄)(d_j - d̄)
          = s²/n + (1/n²) (Σ_c (Σ_{i∈c} (d_i - d̄))² - Σ_i (d_i - d̄)²),   s² the sample variance (ddof=1).

    Args:
        d (Sequence[float]): per-item values (n ≥ 2).
        clusters (Sequence): the cluster key of each item (n).
    """
    n = len(d)
    mean = math.fsum(d) / n
    sums: dict = {}
    for x, c in zip(d, clusters):
        sums[c] = sums.get(c, 0.0) + (x - mean)
    squares = math.fsum((x - mean) ** 2 for x in d)
    cross = math.fsum(s * s for s in sums.values()) - squares
    return math.sqrt(max(squares / (n - 1) / n + cross / n**2, 0.0))


def item_means(records: Iterable[Record]) -> tuple[dict[str, float], dict[str, str]]:
    """Per item: the mean of its item-level records, and its cluster key (where one is recorded).

    Raises EvidenceError when one item carries two different cluster keys, or two different sub-scores.
    """
    sums: dict[str, list[float]] = {}
    clusters: dict[str, str] = {}
    parts: dict[str, str | None] = {}
    for r in records:
        if not r.is_item:
            continue
        if parts.setdefault(r.item, r.subscore) != r.subscore:
            raise EvidenceError(f"item {r.item!r}: two sub-scores ({parts[r.item]!r}, {r.subscore!r}); an item "
                                "counts toward one sub-score (give items of different sub-scores different ids)")
        sums.setdefault(r.item, []).append(r.value)
        if r.cluster is not None:
            if clusters.setdefault(r.item, r.cluster) != r.cluster:
                raise EvidenceError(f"item {r.item!r}: two cluster keys ({clusters[r.item]!r}, {r.cluster!r}); "
                                    "an item belongs to one cluster")
    return {k: math.fsum(v) / len(v) for k, v in sums.items()}, clusters


MCNEMAR_EXACT_BELOW = 25  # discordant pairs: below this many, the exact binomial test


def mcnemar(n10: int, n01: int, t_test: DiffResult | None, n: int, confidence: float) -> DiffResult:
    """McNemar's test of paired 0/1 items (module docstring): p exact binomial when n10 + n01 < 25, else the
    continuity-corrected chi-square; the paired t's difference, SE and interval (exact when every d_i is equal).

    Args:
        n10, n01 (int): items only A scored 1 on, only B. t_test: the paired t of the same items. n: items.
    """
    from scipy import stats

    m = n10 + n01
    if m == 0:
        p, method = 1.0, "McNemar (no item differs)"
    elif m < MCNEMAR_EXACT_BELOW:
        p, method = float(stats.binomtest(n10, m, 0.5).pvalue), "McNemar exact binomial"
    else:
        p, method = float(stats.chi2.sf((abs(n10 - n01) - 1) ** 2 / m, 1)), "McNemar chi-square"
    if t_test is None:  # every item differs the same way (or none differs): the difference is exact
        diff = (n10 - n01) / n
        return DiffResult("paired", diff, 0.0, float(n - 1), math.copysign(math.inf, diff) if diff else 0.0, p, diff,
                          diff, (n,), None, method, (n10, n01), 1 - confidence)
    return DiffResult("paired", t_test.diff, t_test.se, t_test.df, t_test.t, p, t_test.ci_low, t_test.ci_high, (n,),
                      None, method, (n10, n01), 1 - confidence)


def paired(a: Mapping[str, float], b: Mapping[str, float], clusters: Mapping[str, str] | None = None, *,
           confidence: float = 0.95, min_items: int = 2) -> tuple[DiffResult | None, DiffResult | None]:
    """Paired per-item difference A - B over the items both scored, and its clustered version.

    Args:
        a, b (Mapping[str, float]): item id -> that model's (mean) score on the item.
        clusters (Mapping[str, str] | None): item id -> cluster key; items without one are singletons.
        min_items (int): fewer common items give no test.

    Returns:
        (paired, clustered): the iid paired test (ν = n - 1) and, when any item carries a cluster key and
        there are at least 2 clusters, the clustered test (SE_C, ν = C - 1); each None when not computable.
    """
    common = sorted(set(a) & set(b))
    n = len(common)
    if n < max(min_items, 2):
        return None, None
    d = [a[i] - b[i] for i in common]
    s = summarize(d)
    iid = difference_test("paired", s.mean, s.se, n - 1, (n,), confidence)
    if all(a[i] in (0.0, 1.0) and b[i] in (0.0, 1.0) for i in common):
        iid = mcnemar(sum(x > 0 for x in d), sum(x < 0 for x in d), iid, n, confidence)
    clustered = None
    if clusters and any(i in clusters for i in common):
        keys = [("cluster", clusters[i]) if i in clusters else ("item", i) for i in common]
        count = len(set(keys))
        if count >= 2:
            clustered = difference_test("clustered", s.mean, clustered_se(d, keys), count - 1, (n,), confidence, count)
    return iid, clustered
