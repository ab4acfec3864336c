"""Model A against model B on one metric: the tests of ``stats``, the ledger's noise, a verdict in words, every
sub-score (``subscores.compare_subscores``) and, where A or B has training replicates, what they say
(``replicates.replicate_evidence``)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from .. import EvidenceError
from ..difference import registry as tests
from ..ledger.ledger import Record
from ..stats.grades import Grid, detect_grid
from ..stats.noise import PooledNoise, pooled_noise, repeats_needed
from ..stats.replicates import ReplicateEvidence, replicate_evidence
from ..stats.stats import DiffResult, Summary, harness_se, item_means, of_one_metric, runs_by_model, summarize
from .subscores import SubScoreComparison, compare_subscores, sub_keys

VERDICTS = {
    "a_better": "{a} is better beyond eval noise",
    "b_better": "{b} is better beyond eval noise",
    "a_higher": "{a} scores higher beyond eval noise (no direction recorded for {metric})",
    "b_higher": "{b} scores higher beyond eval noise (no direction recorded for {metric})",
    "within_noise": "within noise",
    "not_enough_runs": "not enough runs",
}


@dataclass(frozen=True)
class Comparison:
    """Model A against model B on one metric: the tests, the ledger's noise, repeats needed and a verdict.

    verdict_code is one of ``a_better``, ``b_better``, ``a_higher``, ``b_higher`` (no direction recorded),
    ``within_noise``, ``not_enough_runs``; ``verdict`` is the same in words with the names filled in.
    tests: every registered difference test's result, name -> result (None: not applicable), in report order;
    ``comparison.<name>`` reads one. decided_by is the name of the test the verdict rests on (None: none).
    subscores: every sub-score of A against B, and what the difference costs the others (None when neither
    recorded any).
    grid: the grid the metric's run values across all models lie on (``grades.detect_grid``), or None.
    env: the eval environment every record compared was measured under (``environment.Environment.to_dict``),
    None when the caller did not say. replicates: the training replicates of A and B (None without any).
    """

    a: str
    b: str
    metric: str
    higher_is_better: bool | None
    confidence: float
    a_summary: Summary | None
    b_summary: Summary | None
    tests: tuple[tuple[str, DiffResult | None], ...]
    pooled: PooledNoise | None
    detect: float | None
    noise_sd: float | None
    repeats_needed: int | None
    decided_by: str | None
    verdict_code: str
    verdict: str
    reasons: tuple[str, ...] = ()
    subscores: SubScoreComparison | None = None
    grid: Grid | None = None
    env: dict | None = None
    replicates: ReplicateEvidence | None = None

    def __getattr__(self, name: str) -> DiffResult | None:
        """A registered test's result by its name (``comparison.<name>``)."""
        if name.startswith("__") or name == "tests":
            raise AttributeError(name)
        found = dict(self.tests)
        if name not in found:
            raise AttributeError(f"{type(self).__name__!r} has no attribute {name!r}")
        return found[name]

    def to_dict(self) -> dict:
        out: dict = {}
        for key, value in self.__dict__.items():
            if key == "tests":
                out.update((name, r.to_dict() if r is not None else None) for name, r in value)
                continue
            out[key] = value.to_dict() if hasattr(value, "to_dict") else list(value) if key == "reasons" else value
        return out


def compare_records(a: str, b: str, records: Iterable[Record], *, metric: str | None = None,
                    higher_is_better: bool | None = None, confidence: float = 0.95, min_runs: int = 2,
                    min_items: int = 2, detect: float | None = None, alpha: float = 0.05,
                    power: float = 0.8, target: str | None = None, margins: float | dict | None = None,
                    margin_source: str = "given", replicates: Mapping[str, Sequence[str]] | None = None,
                    env: dict | None = None,
                    decimals: Mapping[str | None, int] | None = None) -> Comparison:
    """Compare A and B on one metric; the verdict rule is exact:

    1. Tests: every registered difference test (``difference/``): per item (items both scored, ≥ ``min_items``;
       with cluster keys, ≥ 2 clusters; 0/1 items) and over whole runs (≥ ``min_runs`` each, some spread).
    2. The verdict rests on the first available in the registry's decision order (clustered, paired, McNemar,
       Welch); none -> "not enough runs".
    3. If that test's ``confidence`` interval for A - B excludes 0, the side the metric's direction favours
       "is better beyond eval noise" (without a recorded direction: "scores higher/lower"); otherwise
       "within noise".

    Also reported: the pooled noise, the runs per model a t test would need to detect ``detect`` (default: the
    observed difference), every sub-score (``compare_subscores``) and, for replicate groups, the training test
    (``replicates.replicate_evidence``; the verdict stays this pair's own). In full: docs/design/evidence.md.

    Args:
        a, b (str): model names.
        records (Iterable[Record]): current records of the metric (any models; stale ones already left out).
        metric (str | None): the metric; None when ``records`` hold exactly one.
        higher_is_better (bool | None): the metric's direction (``Ledger.direction``).
        replicates (Mapping[str, Sequence[str]] | None): replicate groups, root -> members (``Workspace``).
        env (dict | None): the records' one eval environment, reported as it is (the caller chose it).
        decimals (Mapping[str | None, int] | None): the decimals the values were written with, per sub-score (None:
            the metric's own value; ``precision.of_metric``); a grid is looked for only where they are known.
    """
    metric, records = of_one_metric(records, metric)
    runs = runs_by_model(records)
    sa, sb = (replace(summarize(runs[m], model=m, metric=metric, confidence=confidence),
                      harness_se=harness_se(r for r in records if r.model == m)) if runs.get(m) else None
              for m in (a, b))
    ia, ca = item_means(r for r in records if r.model == a)
    ib, cb = item_means(r for r in records if r.model == b)
    for item in set(ca) & set(cb):
        if ca[item] != cb[item]:
            raise EvidenceError(f"item {item!r}: cluster {ca[item]!r} for {a} but {cb[item]!r} for {b}")
    results = tests.run_all(tests.Scores(tuple(runs.get(a, [])), tuple(runs.get(b, [])), ia, ib, {**cb, **ca},
                                         min_items), confidence)
    w = tests.first_needing(tests.RUNS, results)[1]
    reasons = []
    if min(len(runs.get(a, [])), len(runs.get(b, []))) < max(min_runs, 2):
        reasons.append(f"runs: {a} {len(runs.get(a, []))}, {b} {len(runs.get(b, []))} (Welch needs "
                       f"{max(min_runs, 2)} each)")
    elif w is None:
        reasons.append(f"the runs of {a} and {b} do not vary: run noise cannot be estimated from them")
    if not (ia and ib):
        reasons.append("no item-level records for both: no paired test")
    decided = tests.deciding(results)
    if decided is None:
        code = "not_enough_runs"
    elif not decided.beyond_noise:
        code = "within_noise"
    else:
        a_up = decided.diff > 0
        code = (("a_higher" if a_up else "b_higher") if higher_is_better is None
                else "a_better" if a_up == higher_is_better else "b_better")
    pooled = pooled_noise(runs)
    noise = pooled.sd if pooled else None
    if noise is None and w is not None and sa is not None and sb is not None:  # Welch ran: both have a spread
        noise = math.sqrt((sa.sd**2 + sb.sd**2) / 2)
    if detect is None and sa and sb:
        detect = abs(sa.mean - sb.mean)
    needed = repeats_needed(detect, noise, alpha=alpha, power=power) if noise and detect else None
    subs = None
    if sub_keys(records, [a, b]) or target is not None:
        subs = compare_subscores(a, b, records, metric=metric, higher_is_better=higher_is_better,
                                 confidence=confidence, target=target, margins=margins, margin_source=margin_source,
                                 min_runs=min_runs, min_items=min_items, power=power, decimals=decimals)
    reps = replicate_evidence(a, b, runs, replicates, metric=metric, env=(env or {}).get("id"), confidence=confidence)
    if reps is not None and reps.test is not None and decided is not None and (
            reps.test.beyond_noise != decided.beyond_noise):
        said = "is beyond" if reps.test.beyond_noise else "is within"
        reasons.append(f"over trainings (training plus evaluation noise) the difference {said} noise "
                       f"(p {reps.test.p:.3g}): the verdict above is about these trainings of {a} and {b}")
    return Comparison(a, b, metric, higher_is_better, confidence, sa, sb, tuple(results.items()), pooled, detect, noise,
                      needed, decided.kind if decided else None, code,
                      VERDICTS[code].format(a=a, b=b, metric=metric), tuple(reasons), subs,
                      detect_grid([v for vs in runs.values() for v in vs], decimals=(decimals or {}).get(None)), env,
                      reps)
