"""Error bars for evaluations: summaries of repeated runs, and the tests of a difference A - B.

The plain, well-known statistics (Evan Miller, "Adding Error Bars to Evals", 2024, is the anchor):

    mean        x̄ = Σ x_i / n
    std         s = sqrt(Σ (x_i - x̄)² / (n - 1))                 (sample, ddof=1); 0 when s ≤ 4 n ε max|x_i|
                (round-off of the mean: three runs of 0.092 give s 1.7e-17, which is no spread)
    SE          s / sqrt(n)
    CI          x̄ ± t_{1-α/2, n-1} · SE                           (Student t, α = 1 - confidence)

The difference tests of A - B (Welch over runs; paired, with McNemar's p on 0/1 items, and clustered over
items; McNemar's exact test) are a registry, one file each, in ``evidence/difference/``; ``welch`` and
``paired`` here run them. ``noise.py`` holds the ledger's pooled noise; ``judge/compare.py`` the verdict.
Everything is scipy on plain floats; records come from ``Ledger.records``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace

from .. import EvidenceError
from ..difference.clustered import Clustered
from ..difference.clustered import clustered_se as clustered_se
from ..difference.paired import MCNEMAR_EXACT_BELOW as MCNEMAR_EXACT_BELOW
from ..difference.paired import Paired
from ..difference.paired import mcnemar as mcnemar
from ..difference.registry import Scores
from ..difference.result import DiffResult, mean_std, t_interval
from ..difference.result import difference_test as difference_test
from ..difference.result import round_off as round_off
from ..difference.welch import welch_test
from ..ledger.ledger import Record


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

    @property
    def sd(self) -> float:
        """``std`` of two runs or more (ValueError for a single run, which has none: check ``single_run``)."""
        if self.std is None:
            raise ValueError(f"{self.model}: a single run has no standard deviation")
        return self.std

    def to_dict(self) -> dict:
        return asdict(self)


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
    mean, std = mean_std(xs)
    se = lo = hi = None
    if std is not None:
        se = std / math.sqrt(n)
        lo, hi = t_interval(mean, se, n - 1, confidence)
    return Summary(model, metric, sub, n, mean, std, se, lo, hi, min(xs), max(xs), max(xs) - min(xs), n == 1,
                   confidence, env)


def harness_se(records: Iterable[Record]) -> float | None:
    """The mean of the whole-run records' reported standard errors (lm-eval's ``*_stderr``), None without any."""
    errs = [r.stderr for r in records if not r.is_item and r.stderr is not None]
    return math.fsum(errs) / len(errs) if errs else None


def of_one_metric(records: Iterable[Record], metric: str | None) -> tuple[str, list[Record]]:
    """``(metric, its records)``: ``metric``'s records, or the one metric they all hold when it is None.

    Raises:
        EvidenceError: no metric named and the records hold several.
    """
    records = list(records)
    metrics = {r.metric for r in records}
    if metric is None:
        if len(metrics) > 1:
            raise EvidenceError(f"records of several metrics ({', '.join(sorted(metrics))}); name the metric")
        metric = next(iter(metrics), "")
    return metric, [r for r in records if r.metric == metric]


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


def item_means(records: Iterable[Record]) -> tuple[dict[str, float], dict[str, str]]:
    """Per item: the mean of its item-level records, and its cluster key (where one is recorded).

    Raises EvidenceError when one item carries two different cluster keys, or two different sub-scores.
    """
    sums: dict[str, list[float]] = {}
    clusters: dict[str, str] = {}
    parts: dict[str, str | None] = {}
    for r in records:
        if r.item is None:  # a whole run (``is_item`` is False)
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


def welch(a: Sequence[float], b: Sequence[float], confidence: float = 0.95) -> DiffResult | None:
    """Welch's t test of two models' repeated runs (``difference/welch.py``); None under 2 runs or no spread."""
    return welch_test(a, b, confidence)


def paired(a: Mapping[str, float], b: Mapping[str, float], clusters: Mapping[str, str] | None = None, *,
           confidence: float = 0.95, min_items: int = 2) -> tuple[DiffResult | None, DiffResult | None]:
    """Paired per-item difference A - B over the items both scored (McNemar's p when every item is 0 or 1), and
    its clustered version (``difference/paired.py``, ``difference/clustered.py``).

    Args:
        a, b (Mapping[str, float]): item id -> that model's (mean) score on the item.
        clusters (Mapping[str, str] | None): item id -> cluster key; items without one are singletons.
        min_items (int): fewer common items give no test.

    Returns:
        (paired, clustered): the iid paired test (ν = n - 1) and, when any item carries a cluster key and
        there are at least 2 clusters, the clustered test (SE_C, ν = C - 1); each None when not computable.
    """
    scores = Scores(items_a=a, items_b=b, clusters=clusters or {}, min_items=min_items)
    return Paired().run(scores, confidence), Clustered().run(scores, confidence)
