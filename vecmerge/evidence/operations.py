"""One function per evidence command, each returning JSON-ready data: the CLI only parses flags and prints.

The caller supplies what lives outside the ledger: ``current_sha`` (workspace name -> the adapter's current
content sha256, so stale records are left out) and, for ``ls``, the workspace entries.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence

from . import EvidenceError
from .calibrate import calibrate_records
from .compare import compare
from .gate import GateConfig
from .grades import detect_grid
from .importers import export_csv_text, import_files
from .ledger import Entry, Ledger, Plan
from .noise import pooled_noise
from .sequential import TEST, decide_plan
from .stats import runs_by_model, summarize_records
from .subscores import compare_subscores, sub_keys, sub_runs

__all__ = ["add", "import_", "export", "show", "compare_models", "calibrate_metrics", "ls_rows", "gate_evidence",
           "plan", "decide"]


def add(ledger: Ledger, name: str, values: Sequence[float], *, metric: str, sha256: str | None,
        subs: Mapping[str, float | Sequence[float]] | None = None, note: str | None = None,
        higher_is_better: bool | None = None) -> dict:
    """``vecmerge evidence add NAME VALUE... --metric M [--sub K=V[,V...]] [--note] [--higher/--lower-is-better]``.

    One transaction: the runs, and the metric's direction when given.

    Args:
        subs: sub-score -> one value per run (a list as long as ``values``; a single number for a single run).

    Returns:
        dict: ``{"model", "metric", "sha256", "values", "ids", "direction"}``.
    """
    values = list(values)
    per_run: list[dict[str, float]] = [{} for _ in values]
    for key, given in (subs or {}).items():
        given = [given] if not isinstance(given, Sequence) else list(given)
        if len(given) != len(values):
            raise EvidenceError(f"{name}: --sub {key} has {len(given)} value(s) for {len(values)} run(s); give one "
                                f"per run, in the runs' order: --sub {key}=V1,V2,...")
        for run, v in zip(per_run, given):
            run[key] = v
    entries = [Entry(name, metric, v, sha256, s, note=note) for v, s in zip(values, per_run)]
    ids = ledger.write(entries, None if higher_is_better is None else {metric: higher_is_better})
    return {"model": name, "metric": metric, "sha256": sha256, "values": values, "ids": ids,
            "direction": ledger.direction(metric), "subs": {k: [r[k] for r in per_run] for k in (subs or {})}}


def import_(ledger: Ledger, paths: Iterable[str], *,
            current_sha: Mapping[str, str | None] | Callable[[str], str | None] | None = None,
            model: str | None = None, cluster_field: str | None = None, task: str | None = None,
            directions: Mapping[str, bool] | None = None) -> dict:
    """``vecmerge evidence import FILE... [--model NAME] [--cluster-field KEY] [--higher-is-better M]``:
    ``importers.import_files`` (``current_sha``: a mapping or a function of the model name)."""
    return import_files(ledger, paths, sha_of=current_sha or {}, model=model, cluster_field=cluster_field, task=task,
                        directions=directions)


def export(ledger: Ledger, fmt: str = "csv", *, current_sha: Mapping[str, str | None] | None = None) -> str:
    """``vecmerge evidence export --format csv|json``: every record (stale ones flagged) as text."""
    rows = ledger.export(current_sha=current_sha)
    if fmt == "csv":
        return export_csv_text(rows)
    if fmt == "json":
        return json.dumps({"directions": ledger.directions(), "records": rows}, indent=2) + "\n"
    raise EvidenceError(f"--format {fmt}: use csv or json")


def _check_known(ledger: Ledger, names: Iterable[str], metric: str | None) -> None:
    known = set(ledger.models())
    missing = [n for n in names if n not in known]
    if missing:
        raise EvidenceError(f"no records of {', '.join(missing)} in {ledger.path}; known: "
                            f"{', '.join(sorted(known)) or 'none'}")
    if metric is not None and metric not in ledger.metrics():
        raise EvidenceError(f"metric {metric!r}: no records in {ledger.path}; known: "
                            f"{', '.join(ledger.metrics()) or 'none'}")


def show(ledger: Ledger, names: Sequence[str] | None = None, metric: str | None = None, *,
         current_sha: Mapping[str, str | None] | None = None, include_stale: bool = False,
         confidence: float = 0.95) -> dict:
    """``vecmerge evidence show [NAME...] [--metric M] [--stale]``: summaries per model and sub-score.

    Returns:
        dict: ``{"summaries": [Summary.as_dict()...], "stale": [{"model", "metric", "records", "sha256s"}],
        "item_level": [{"model", "metric", "items", "records"}], "grids": [{"metric", "sub", **Grid.as_dict()}],
        "directions": {...}, "include_stale"}``. Stale records are counted in ``stale`` and enter the summaries
        only with ``include_stale``. ``grids``: each metric and sub-score whose run values across the models
        shown lie on a grid (``grades.detect_grid``).
    """
    _check_known(ledger, names or [], metric)
    every = ledger.records(names, metric, current_sha=current_sha, include_stale=True)
    used = [r for r in every if include_stale or not r.stale]
    stale: dict[tuple[str, str], list] = {}
    for r in every:
        if r.stale:
            stale.setdefault((r.model, r.metric), []).append(r.sha256)
    items: dict[tuple[str, str], list] = {}
    for r in used:
        if r.is_item:
            items.setdefault((r.model, r.metric), []).append(r.item)
    return {
        "summaries": [s.as_dict() for s in summarize_records(used, confidence=confidence)],
        "stale": [{"model": m, "metric": k, "records": len(v), "sha256s": sorted({s or "" for s in v})}
                  for (m, k), v in stale.items()],
        "item_level": [{"model": m, "metric": k, "items": len(set(v)), "records": len(v)}
                       for (m, k), v in items.items()],
        "grids": _grids(used), "directions": ledger.directions(), "include_stale": include_stale,
    }


def _grids(records) -> list[dict]:
    """Every metric and sub-score whose whole-run values lie on a grid (``grades.detect_grid``)."""
    out = []
    for metric in dict.fromkeys(r.metric for r in records):
        mine = [r for r in records if r.metric == metric]
        series = {None: [v for vs in runs_by_model(mine).values() for v in vs]}
        series.update({k: [v for vs in by_model.values() for v in vs]
                       for k, by_model in sorted(sub_runs(mine).items())})
        for sub, values in series.items():
            grid = detect_grid(values)
            if grid is not None:
                out.append({"metric": metric, "sub": sub, **grid.as_dict()})
    return out


def _one_metric(ledger: Ledger, names: Sequence[str], metric: str | None, current_sha) -> str:
    if metric is not None:
        return metric
    shared = None
    for n in names:
        mine = {r.metric for r in ledger.records([n], current_sha=current_sha)}
        shared = mine if shared is None else shared & mine
    if not shared or len(shared) > 1:
        what = f"metrics {', '.join(sorted(shared))}" if shared else "no metric"
        raise EvidenceError(f"{' and '.join(names)} share {what}; name one with --metric")
    return next(iter(shared))


def compare_models(ledger: Ledger, a: str, b: str, metric: str | None = None, *,
                   current_sha: Mapping[str, str | None] | None = None, include_stale: bool = False,
                   confidence: float = 0.95, detect: float | None = None, min_runs: int = 2,
                   target: str | None = None, margin: float | None = None) -> dict:
    """``vecmerge evidence compare A B [--metric M] [--detect D] [--target K] [--margin M]``: ``compare.compare``
    over the ledger, every sub-score included (``target``: the one being raised; ``margin``: for all).

    The pooled noise is over every model's current runs of the metric. Returns ``Comparison.as_dict()``.
    """
    _check_known(ledger, [a, b], metric)
    metric = _one_metric(ledger, [a, b], metric, current_sha)
    records = ledger.records(metric=metric, current_sha=current_sha, include_stale=include_stale)
    if target is not None and target not in (known := sub_keys(records, [a, b])):
        raise EvidenceError(f"--target {target}: {a} and {b} recorded no such sub-score of {metric}; known: "
                            f"{', '.join(known) or 'none'}")
    return compare(a, b, records, metric=metric, higher_is_better=ledger.direction(metric), confidence=confidence,
                   detect=detect, min_runs=min_runs, target=target, margins=margin,
                   margin_source="--margin").as_dict()


def calibrate_metrics(ledger: Ledger, proxy: str, target: str, *,
                      current_sha: Mapping[str, str | None] | None = None, **options) -> dict:
    """``vecmerge evidence calibrate --proxy P --target T [--min-models N]``: ``Calibration.as_dict()``."""
    _check_known(ledger, [], proxy)
    _check_known(ledger, [], target)
    records = ledger.records(current_sha=current_sha)
    return calibrate_records(records, proxy, target, directions=ledger.directions(), **options).as_dict()


def ls_rows(entries: Mapping[str, Mapping], ledger: Ledger | None, *, metric: str | None = None) -> list[dict]:
    """``vecmerge ls``: one row per workspace entry.

    Args:
        entries: name -> ``{"path", "sha256", "base_model", "parent"}`` (the caller reads the workspace).
        ledger (Ledger | None): the evidence ledger (None: no runs column).
        metric (str | None): the default metric for ``runs`` and ``mean``.

    Returns:
        list[dict]: ``{"name", "path", "sha256", "sha256_short", "base_model", "parent", "runs", "mean",
        "stale"}`` with runs / mean / stale over current whole-run records of ``metric`` (None without one).
    """
    current = {n: e.get("sha256") for n, e in entries.items()}
    records = (ledger.records(list(entries), metric, current_sha=current, include_stale=True)
               if ledger is not None and metric else [])
    fresh = runs_by_model(r for r in records if not r.stale)
    old = runs_by_model(r for r in records if r.stale)
    rows = []
    for name, e in entries.items():
        sha = e.get("sha256")
        runs = fresh.get(name, [])
        rows.append({"name": name, "path": e.get("path"), "sha256": sha, "sha256_short": sha[:12] if sha else None,
                     "base_model": e.get("base_model"), "parent": e.get("parent"),
                     "runs": len(runs) if metric else None, "mean": sum(runs) / len(runs) if runs else None,
                     "stale": len(old.get(name, [])) if metric else None})
    return rows


def gate_evidence(ledger: Ledger, backbone: str, x: str, y: str, metric: str, *,
                  current_sha: Mapping[str, str | None] | None = None, config: GateConfig | None = None) -> dict:
    """The ledger's part of ``gate.GateFacts``: ``backbone_runs``, ``typical_noise`` (pooled over the models
    other than the backbone) and ``comparison`` (X vs Y at the config's confidence and min_evidence_runs).

    Returns:
        dict: keyword arguments for ``GateFacts(backbone, x, y, ..., **gate_evidence(...))``.
    """
    c = config or GateConfig()
    records = ledger.records(metric=metric, current_sha=current_sha)
    runs = runs_by_model(records)
    keys = None if c.protect in (None, "all") else list(c.protect)
    subs = compare_subscores(x, y, records, metric=metric, higher_is_better=ledger.direction(metric),
                             confidence=c.confidence, keys=keys, margins=c.margin,
                             margin_source=c.source_of("margin"), min_runs=c.min_evidence_runs)
    plans = ledger.plans(x, y, metric)
    latest = plans[-1] if plans else None
    decision = None
    if latest is not None:
        _check_plan_weights(latest, current_sha)
        decision = decide_plan(latest, ledger.records([x, y], metric, include_stale=True))
    return {"backbone_runs": tuple(runs.get(backbone, [])),
            "typical_noise": pooled_noise({m: v for m, v in runs.items() if m != backbone}),
            "comparison": compare(x, y, records, metric=metric, higher_is_better=ledger.direction(metric),
                                  confidence=c.confidence, min_runs=c.min_evidence_runs),
            "subscores": subs, "plan": latest, "plan_decision": decision}


def plan(ledger: Ledger, a: str, b: str, *, metric: str, min_effect: float, max_runs: int, alpha: float = 0.05,
         current_sha: Mapping[str, str | None] | None = None) -> dict:
    """``vecmerge evidence plan A --vs B --metric M --min-effect D --max-runs N [--alpha 0.05]``: record a plan.

    The metric's direction must be declared; the ledger's pooled noise now sets the prior scale (D / sd).
    Returns ``{"plan": Plan.as_dict(), "looks_from": record id}``: runs recorded after it are its looks.
    """
    direction = ledger.direction(metric)
    if direction is None:
        raise EvidenceError(f"{metric}: no direction recorded; declare it first (evidence add ... "
                            "--higher-is-better, or evidence import --higher-is-better METRIC)")
    current = current_sha or {}
    noise = pooled_noise(runs_by_model(ledger.records(metric=metric, current_sha=current_sha)))
    sd = noise.sd if noise is not None and noise.sd > 0 else None
    made = ledger.add_plan(Plan(0, a, b, metric, current.get(a), current.get(b), min_effect, max_runs, alpha,
                                direction, sd, min_effect / sd if sd else 1.0, TEST))
    return {"plan": made.as_dict(), "looks_from": made.after_record + 1}


def _check_plan_weights(p: Plan, current_sha) -> None:
    for name, planned in ((p.a, p.a_sha256), (p.b, p.b_sha256)):
        now = (current_sha or {}).get(name, planned)
        if now != planned:
            raise EvidenceError(f"plan {p.id}: {name} now has other weights (sha256 {str(now)[:12]}, the plan's "
                                f"{str(planned)[:12]}); record a new plan for these weights")


def decide(ledger: Ledger, a: str, b: str, metric: str | None = None, *,
           current_sha: Mapping[str, str | None] | None = None, replay: bool = False) -> dict:
    """``vecmerge evidence decide A --vs B [--metric M] [--replay]``: the latest plan's anytime-valid decision.

    Returns:
        dict: ``{"decision": stop_better | stop_futile | continue, "plan": Plan.as_dict(), "reason", "runs",
        "after_stop", "beyond_max", "more_runs", "last": Look.as_dict(), "looks": [...] (replay only)}``.
    """
    plans = ledger.plans(a, b, metric)
    if not plans:
        raise EvidenceError(f"no plan of {a} --vs {b}" + (f" on {metric}" if metric else "") + f" in {ledger.path}; "
                            f"record one first: vecmerge evidence plan {a} --vs {b} --metric M --min-effect D "
                            "--max-runs N")
    if metric is None and len({p.metric for p in plans}) > 1:
        raise EvidenceError(f"plans of {a} --vs {b} on several metrics ({', '.join(sorted({p.metric for p in plans}))}"
                            "); name one with --metric")
    latest = plans[-1]
    _check_plan_weights(latest, current_sha)
    decision = decide_plan(latest, ledger.records([a, b], latest.metric, include_stale=True))
    return {"decision": decision.decision, "plan": latest.as_dict(), "plans": len(plans),
            **{k: v for k, v in decision.as_dict(replay).items() if k != "decision"}}
