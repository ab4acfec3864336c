"""Every sub-score of A against B: the test, Holm across sub-scores, grades, and what a change costs the others.

Per sub-score K of the metric (whole runs carry K in ``subs``, item records name it in ``subscore``), with
better = sign * (A - B): the first registered difference test that applies (``difference/``); *worse* when the
Holm-adjusted two-sided p < alpha with better < 0, or the whole interval lies below -margin; *not worse* by
non-inferiority at margin m (t = (better + m) / SE, one-sided, Holm across the family); *unknown* otherwise,
with the runs a test would need; a zero-variance K is decided exactly, outside the families. The margin is
given, else one grade of K's grid (``grades.detect_grid``), else K's pooled noise sd. The family: the compared
sub-scores with a test, the target left out; alpha = 1 - confidence.
Why, and what each row says: docs/design/evidence.md.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypedDict

from .. import EvidenceError
from ..difference import registry as tests
from ..ledger.ledger import Record
from ..stats.grades import Grid, detect_grid
from ..stats.holm import holm
from ..stats.noise import pooled_noise, repeats_needed
from ..stats.stats import DiffResult, Summary, item_means, of_one_metric, summarize

WORSE, NOT_WORSE, UNKNOWN = "worse", "not_worse", "unknown"
ZERO_SPREAD = "assuming this sub-score does not vary between runs of one model"


@dataclass(frozen=True)
class SubScoreRow:
    """One sub-score of A against B (module docstring): summaries, the test, Holm, the margin, the status.

    ``diff`` is A - B; ``better`` the same in the metric's direction (> 0: A better). ``p``/``p_holm``: the
    two-sided test of no difference; ``p_noninferior``/``p_noninferior_holm``: the one-sided test at the margin.
    ``status`` is ``worse``, ``not_worse`` or ``unknown``; ``more_runs``: runs per model to decide (unknown).
    """

    key: str
    a_summary: Summary | None
    b_summary: Summary | None
    test: DiffResult | None
    diff: float | None
    better: float | None
    zero_variance: bool
    p: float | None
    p_holm: float | None
    margin: float | None
    margin_source: str | None
    p_noninferior: float | None
    p_noninferior_holm: float | None
    grid: Grid | None
    below_one_grade: bool | None
    noise_sd: float | None
    status: str
    reason: str
    more_runs: int | None
    target: bool = False

    def to_dict(self) -> dict:
        out = dict(self.__dict__)
        for key in ("a_summary", "b_summary", "test", "grid"):
            out[key] = None if out[key] is None else out[key].to_dict()
        out["kind"] = self.test.kind if self.test else ("exact" if self.zero_variance else None)
        return out


@dataclass(frozen=True)
class SubScoreComparison:
    """Every compared sub-score of A against B, and the cost summary: worse / not worse / unknown."""

    a: str
    b: str
    metric: str
    higher_is_better: bool | None
    confidence: float
    rows: tuple[SubScoreRow, ...]
    target: str | None
    family: tuple[str, ...]

    def row(self, key: str) -> SubScoreRow:
        return next(r for r in self.rows if r.key == key)

    def keys(self, status: str) -> list[str]:
        """The sub-scores other than the target with this status."""
        return [r.key for r in self.rows if r.status == status and not r.target]

    def to_dict(self) -> dict:
        return {"a": self.a, "b": self.b, "metric": self.metric, "higher_is_better": self.higher_is_better,
                "confidence": self.confidence, "target": self.target, "family": list(self.family),
                "subscores": {r.key: r.to_dict() for r in self.rows},
                "cost": {"worse": self.keys(WORSE), "not_worse": self.keys(NOT_WORSE),
                         "unknown": self.keys(UNKNOWN)}}


def sub_runs(records: Iterable[Record]) -> dict[str, dict[str, list[float]]]:
    """Whole-run sub-score values: sub-score -> model -> values in record order."""
    out: dict[str, dict[str, list[float]]] = {}
    for r in records:
        if not r.is_item:
            for key, value in r.subs:
                out.setdefault(key, {}).setdefault(r.model, []).append(value)
    return out


def sub_keys(records: Iterable[Record], models: Sequence[str]) -> list[str]:
    """The sub-scores any of ``models`` has recorded (run subs or item-level subscore), sorted."""
    return sorted({k for r in records if r.model in models for k in
                   ([r.subscore] if r.is_item and r.subscore else [k for k, _ in r.subs])})


Margins = float | Mapping[str, float] | None  # one margin, one per sub-score, or none given


def _margin_for(key: str, margins: Margins, grid: Grid | None, noise: float | None, source: str
                ) -> tuple[float | None, str | None]:
    """The margin of sub-score ``key`` and where it came from, in words (the report names it per row)."""
    if isinstance(margins, Mapping) and key in margins:
        return float(margins[key]), source
    if margins is not None and not isinstance(margins, Mapping):
        return float(margins), source
    if grid is not None:
        return grid.step, (f"one grade, {grid.step:.4g}: {len(grid.levels)} distinct values sit on it within their "
                           f"written precision {2 * grid.tolerance:.0e}")
    if noise is not None and noise > 0:
        return noise, "pooled within-model noise sd"
    return None, None


class _Part(TypedDict):
    """One sub-score's figures before the families are known: the fields ``SubScoreRow`` takes from ``_one``."""

    key: str
    a_summary: Summary | None
    b_summary: Summary | None
    test: DiffResult | None
    diff: float | None
    zero_variance: bool
    margin: float | None
    margin_source: str | None
    grid: Grid | None
    below_one_grade: bool | None
    noise_sd: float | None


def _one(key: str, a: str, b: str, metric: str, runs: Mapping[str, list[float]], items: Mapping[str, list[Record]],
         margins: Margins, margin_source: str, confidence: float, min_runs: int, min_items: int,
         decimals: int | None) -> tuple[_Part, tuple[int, int]]:
    """One sub-score's figures before the families are known, and the runs of A and B (``runs``: model ->
    values, every model)."""
    ra, rb = runs.get(a, []), runs.get(b, [])
    sa = summarize(ra, model=a, metric=metric, sub=key, confidence=confidence) if ra else None
    sb = summarize(rb, model=b, metric=metric, sub=key, confidence=confidence) if rb else None
    ia, ca = item_means(items.get(a, []))
    ib, cb = item_means(items.get(b, []))
    test = tests.deciding(tests.run_all(tests.Scores(tuple(ra), tuple(rb), ia, ib, {**cb, **ca}, min_items),
                                        confidence))
    zero = bool(test is None and sa is not None and sb is not None and min(len(ra), len(rb)) >= max(min_runs, 2)
                and sa.std == 0 and sb.std == 0)
    diff = test.diff if test is not None else (sa.mean - sb.mean) if zero and sa and sb else None
    grid = detect_grid([v for vs in runs.values() for v in vs], decimals=decimals)
    pooled = pooled_noise(runs)
    noise = pooled.sd if pooled and pooled.sd > 0 else (
        math.sqrt((sa.std**2 + sb.std**2) / 2) if sa and sb and sa.std and sb.std else None)
    margin, source = _margin_for(key, margins, grid, noise, margin_source)
    below = grid.below_one_grade(diff) if grid is not None and diff is not None else None
    return _Part(key=key, a_summary=sa, b_summary=sb, test=test, diff=diff, zero_variance=zero, margin=margin,
                 margin_source=source, grid=grid, below_one_grade=below, noise_sd=noise), (len(ra), len(rb))


def compare_subscores(a: str, b: str, records: Iterable[Record], *, metric: str | None = None,
                      higher_is_better: bool | None = None, confidence: float = 0.95,
                      keys: Sequence[str] | None = None, target: str | None = None,
                      margins: float | Mapping[str, float] | None = None, margin_source: str = "given",
                      min_runs: int = 2, min_items: int = 2, power: float = 0.8,
                      decimals: Mapping[str | None, int] | None = None) -> SubScoreComparison:
    """Compare A and B on every sub-score of one metric (the rule is the module docstring's).

    Args:
        a, b (str): model names (A is the candidate, B the reference).
        records (Iterable[Record]): current records of the metric (all models: grids and noise use them all).
        metric (str | None): the metric; None when ``records`` hold exactly one.
        higher_is_better (bool | None): the metric's direction (its sub-scores share it); None: all unknown.
        confidence (float): interval coverage; alpha = 1 - confidence for every test.
        keys (Sequence[str] | None): the sub-scores to compare (default: every one A or B recorded).
        target (str | None): the sub-score being raised: reported, left out of the family and the cost lists.
        margins (float | Mapping[str, float] | None): non-inferiority margins (one, or per sub-score;
            others default as in the module docstring). margin_source (str): where a given margin came from.
        min_runs (int): runs each model needs for Welch and for a zero-variance decision.
        min_items (int): items both scored for a paired test. power (float): for ``more_runs``.
        decimals (Mapping[str | None, int] | None): sub-score -> the decimals its values were written with
            (``precision.of_metric``; key ``"*"``: every sub-score); unknown: no grade, no grade margin.
    """
    metric, records = of_one_metric(records, metric)
    for value in ([margins] if not isinstance(margins, Mapping) else margins.values()):
        if value is not None and not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
            raise EvidenceError(f"margin {value!r}: a difference > 0 in the metric's units")
    keys = list(dict.fromkeys(keys)) if keys is not None else sub_keys(records, [a, b])
    runs = sub_runs(records)
    items: dict[str, dict[str, list[Record]]] = {}
    for r in records:
        if r.is_item and r.subscore:
            items.setdefault(r.subscore, {}).setdefault(r.model, []).append(r)
    alpha = 1 - confidence
    known = decimals or {}
    parts = [_one(k, a, b, metric, runs.get(k, {}), items.get(k, {}), margins, margin_source, confidence, min_runs,
                  min_items, known.get(k, known.get("*"))) for k in keys]
    sign = None if higher_is_better is None else (1.0 if higher_is_better else -1.0)
    tested = {p["key"]: (t, p["margin"]) for p, _ in parts if (t := p["test"]) is not None}
    family = [k for k in tested if k != target and sign is not None]
    two = {k: tested[k][0].p for k in family}
    from scipy import stats

    ni = {k: float(stats.t.sf((sign * t.diff + m) / t.se, t.df)) for k in family
          for t, m in [tested[k]] if sign is not None and m is not None}
    two_holm, ni_holm = holm(two), holm(ni)
    rows = []
    for p, (na, nb) in parts:
        key, t, m = p["key"], p["test"], p["margin"]
        better = None if sign is None or p["diff"] is None else sign * p["diff"]
        status, more = UNKNOWN, None
        if sign is None:
            reason = f"no direction recorded for {metric} (its sub-scores share it)"
        elif p["zero_variance"]:
            status = WORSE if better is not None and better < 0 else NOT_WORSE  # zero spread: diff is exact
            reason = (f"every run of each model scored one value ({na} and {nb} runs): the difference "
                      f"{p['diff']:+.4g} is exact, {ZERO_SPREAD}")
        elif t is None:
            reason = (f"runs of {key}: {a} {na}, {b} {nb}" + (" (no spread to estimate noise from)"
                      if min(na, nb) >= 2 else f" (Welch needs {max(min_runs, 2)} each)"))
        else:
            upper = sign * (t.ci_high if sign > 0 else t.ci_low)
            if key != target and two_holm[key] < alpha and better is not None and better < 0:
                status, reason = WORSE, f"worse beyond noise (Holm p {two_holm[key]:.3g} < {alpha:g})"
            elif m is not None and upper < -m:
                status, reason = WORSE, f"the whole interval lies below -{m:.4g}"
            elif key != target and key in ni_holm and ni_holm[key] < alpha:
                status, reason = NOT_WORSE, f"not worse by {m:.4g} (one-sided Holm p {ni_holm[key]:.3g})"
            elif key == target:
                reason = "the target: reported, not a constraint"
            else:
                reason = ("no margin: no grid, no noise estimate; give one" if m is None else
                          f"not shown either way at margin {m:.4g}")
        if status == UNKNOWN and m is not None and better is not None and p["noise_sd"] and key != target:
            share = alpha / max(1, len(family))
            needed = (repeats_needed(better + m, p["noise_sd"], alpha=share, power=power, sides=1)
                      if better + m > 0 else repeats_needed(better, p["noise_sd"], alpha=share, power=power))
            more = None if needed is None else max(1, needed - min(na, nb))
        rows.append(SubScoreRow(**p, better=better, p=t.p if t else None, p_holm=two_holm.get(key),
                                p_noninferior=ni.get(key), p_noninferior_holm=ni_holm.get(key), status=status,
                                reason=reason, more_runs=more, target=key == target))
    return SubScoreComparison(a, b, metric, higher_is_better, confidence, tuple(rows), target, tuple(family))
