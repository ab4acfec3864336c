"""One function per evidence command, each returning JSON-ready data: the CLI only parses flags and prints.

The caller supplies what lives outside the ledger: ``current_sha`` (workspace name -> the adapter's current
content sha256, so stale records are left out), ``replicates`` (replicate groups, root -> members) and, for
``ls``, the workspace entries. ``env`` is the user's choice of eval environment (``environment.EnvChoice``):
no statistic pools records of two environments (``environment.one_environment`` refuses, naming the fields).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence

from . import EvidenceError
from .calibrate import calibrate_records
from .compare import compare_records
from .environment import EnvChoice, canonical_fields, environments, one_environment, records_of_one_environment
from .grades import detect_grid
from .importers import export_csv_text, import_files
from .ledger import Entry, Ledger, Plan
from .loo import calibrate_loo_records
from .noise import pooled_noise
from .ranking import rank_candidates
from .replicates import components, members
from .sequential import TEST, decide_plan, plan_runs
from .stats import runs_by_model, summarize_records
from .subscores import sub_keys, sub_runs
from .suggest import close_name

__all__ = ["add", "import_", "export", "show", "compare_models", "calibrate_metrics", "calibrate_loo_metrics", "rank",
           "ls_rows", "plan", "decide", "check_plan_weights", "plan_looks"]


def add(ledger: Ledger, name: str, values: Sequence[float], *, metric: str, sha256: str | None,
        subs: Mapping[str, float | Sequence[float]] | None = None, note: str | None = None,
        higher_is_better: bool | None = None, env: Mapping[str, str] | None = None,
        workspace_names: Iterable[str] = (), external: bool = False) -> dict:
    """``vecmerge evidence add NAME VALUE... --metric M [--sub K=V[,V...]] [--env K=V] [--note] [--higher-is-better]``.

    One transaction: the runs, and the metric's direction when given. A NAME that is no adapter here
    (``sha256`` None) is an external model, unless it is within ``suggest.close_name`` of a workspace name and
    new to the ledger: that is refused with "did you mean ...?" (``external`` records it anyway).

    Args:
        subs: sub-score -> one value per run (a list as long as ``values``; a single number for a single run).
        env: the runs' eval environment fields (``environment.py``).
        workspace_names: the workspace's adapter names (for the typo check).

    Returns:
        dict: ``{"model", "metric", "sha256", "values", "ids", "direction", "subs", "env", "external"}``.
    """
    names = set(workspace_names)
    if sha256 is None and name not in names and not external and name not in ledger.models():
        near = close_name(name, names)
        if near is not None:
            raise EvidenceError(f"{name} is not an adapter of this workspace: did you mean {near}? (to record an "
                                f"external model of that name, add --external)")
    values = list(values)
    per_run: list[dict[str, float]] = [{} for _ in values]
    for key, given in (subs or {}).items():
        given = [given] if not isinstance(given, Sequence) else list(given)
        if len(given) != len(values):
            raise EvidenceError(f"{name}: --sub {key} has {len(given)} value(s) for {len(values)} run(s); give one "
                                f"per run, in the runs' order: --sub {key}=V1,V2,...")
        for run, v in zip(per_run, given):
            run[key] = v
    fields = canonical_fields(env or {}, "--env")
    entries = [Entry(name, metric, v, sha256, s, note=note, env=fields) for v, s in zip(values, per_run)]
    ids = ledger.write(entries, None if higher_is_better is None else {metric: higher_is_better})
    return {"model": name, "metric": metric, "sha256": sha256, "values": values, "ids": ids,
            "direction": ledger.direction(metric), "subs": {k: [r[k] for r in per_run] for k in (subs or {})},
            "env": {"id": entries[0].environment.id, "fields": dict(fields)} if entries else None,
            "external": sha256 is None and name not in names}


def import_(ledger: Ledger, paths: Iterable[str], *,
            current_sha: Mapping[str, str | None] | Callable[[str], str | None] | None = None,
            model: str | None = None, cluster_field: str | None = None, task: str | None = None,
            directions: Mapping[str, bool] | None = None, adapters=None, home=None,
            env: Mapping[str, str] | None = None) -> dict:
    """``vecmerge evidence import FILE... [--model NAME] [--cluster-field KEY] [--higher-is-better M] [--env K=V]``:
    ``importers.import_files`` (``current_sha``: a mapping or a function of the model name; ``adapters`` and
    ``home``: the workspace's, to match lm-eval's model paths)."""
    return import_files(ledger, paths, sha_of=current_sha or {}, model=model, cluster_field=cluster_field, task=task,
                        directions=directions, adapters=adapters, home=home, env=env)


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
         confidence: float = 0.95, env: EnvChoice | None = None, by: str | None = None,
         replicates: Mapping[str, Sequence[str]] | None = None) -> dict:
    """``vecmerge evidence show [NAME...] [--metric M] [--stale] [--env ID|K=V] [--by env]``: summaries per model,
    sub-score and eval environment (never pooled across environments).

    Returns:
        dict: ``{"summaries": [Summary.to_dict()...] (each with its ``env`` id), "environments": [{"id", "fields",
        "records", "models", "metrics"}], "by", "stale": [{"model", "metric", "records", "sha256s"}],
        "item_level": [{"model", "metric", "items", "records"}], "grids": [{"metric", "sub", "env", **Grid}],
        "replicates": [VarianceComponents.to_dict()], "directions": {...}, "include_stale"}``. Stale records are
        counted in ``stale`` and enter the summaries only with ``include_stale``; ``env`` keeps only the records
        of the environments it names. ``grids``: each metric and sub-score whose run values (one environment)
        lie on a grid (``grades.detect_grid``). ``replicates``: each replicate group's variance components on
        each metric and environment shown.
    """
    if by not in (None, "env"):
        raise EvidenceError(f"--by {by}: env is the one grouping")
    _check_known(ledger, names or [], metric)
    choice = env or EnvChoice()
    every = [r for r in ledger.records(names, metric, current_sha=current_sha, include_stale=True)
             if choice.matches(r.environment)]
    used = [r for r in every if include_stale or not r.stale]
    stale: dict[tuple[str, str], list] = {}
    for r in every:
        if r.stale:
            stale.setdefault((r.model, r.metric), []).append(r.sha256)
    items: dict[tuple[str, str], list] = {}
    for r in used:
        if r.is_item:
            items.setdefault((r.model, r.metric), []).append(r.item)
    envs = environments(used)
    return {
        "summaries": [s.to_dict() for s in summarize_records(used, confidence=confidence)],
        "environments": [{**e.to_dict(), "records": len(rs), "models": sorted({r.model for r in rs}),
                          "metrics": sorted({r.metric for r in rs})} for e, rs in envs.values()],
        "by": by,
        "stale": [{"model": m, "metric": k, "records": len(v), "sha256s": sorted({s or "" for s in v})}
                  for (m, k), v in stale.items()],
        "item_level": [{"model": m, "metric": k, "items": len(set(v)), "records": len(v)}
                       for (m, k), v in items.items()],
        "grids": [g for e, rs in envs.values() for g in _grids(rs, e.id)],
        "replicates": _replicate_rows(used, replicates, confidence),
        "directions": ledger.directions(), "include_stale": include_stale,
    }


def _grids(records, env_id: str) -> list[dict]:
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
                out.append({"metric": metric, "sub": sub, "env": env_id, **grid.to_dict()})
    return out


def _replicate_rows(records, replicates, confidence: float) -> list[dict]:
    """Variance components of every replicate group, per metric and environment of ``records``."""
    out = []
    for env, recs in environments(records).values():
        for metric in dict.fromkeys(r.metric for r in recs):
            runs = runs_by_model(r for r in recs if r.metric == metric)
            for root in replicates or {}:
                c = components(root, replicates, runs, metric=metric, env=env.id, confidence=confidence)
                if c is not None:
                    out.append(c.to_dict())
    return out


def _one_metric(ledger: Ledger, names: Sequence[str], metric: str | None, current_sha) -> str:
    if metric is not None:
        return metric
    shared = stale = None
    for n in names:
        recs = ledger.records([n], current_sha=current_sha, include_stale=True)
        mine, old = {r.metric for r in recs if not r.stale}, {r.metric for r in recs}
        shared = mine if shared is None else shared & mine
        stale = old if stale is None else stale & old
    if len(shared) == 1:
        return next(iter(shared))
    if shared:
        raise EvidenceError(f"{' and '.join(names)} share metrics {', '.join(sorted(shared))}; name one with --metric")
    if stale:
        gone = [n for n in names if not any(not r.stale for r in ledger.records([n], current_sha=current_sha,
                                                                                 include_stale=True))]
        raise EvidenceError(f"the records of {' and '.join(gone or names)} are stale: they measured other weights "
                            f"than {'those names have' if len(gone) != 1 else 'it has'} now (sha256 changed); "
                            "record new runs, or compare the old ones with --stale")
    raise EvidenceError(f"{' and '.join(names)} share no metric; name one with --metric")


def compare_models(ledger: Ledger, a: str, b: str, metric: str | None = None, *,
                   current_sha: Mapping[str, str | None] | None = None, include_stale: bool = False,
                   confidence: float = 0.95, detect: float | None = None, min_runs: int = 2,
                   target: str | None = None, margin: float | None = None, env: EnvChoice | None = None,
                   replicates: Mapping[str, Sequence[str]] | None = None) -> dict:
    """``vecmerge evidence compare A B [--metric M] [--detect D] [--target K] [--margin M] [--env ID|K=V]``:
    ``compare.compare_records`` over the ledger, every sub-score included (``target``: the one being raised; ``margin``:
    for all), in ONE eval environment: A's and B's records (their replicates' too) must share one, or ``env``
    must pick it, else "not the same measurement" naming the fields that differ.

    The pooled noise is over every model's current runs of the metric in that environment. Returns
    ``Comparison.to_dict()``.
    """
    _check_known(ledger, [a, b], metric)
    metric = _one_metric(ledger, [a, b], metric, current_sha)
    records = ledger.records(metric=metric, current_sha=current_sha, include_stale=include_stale)
    chosen, records = records_of_one_environment(records, members([a, b], replicates), env,
                                                 f"{a} and {b} on {metric}")
    stale = {n: sum(r.stale for r in ledger.records([n], metric, current_sha=current_sha, include_stale=True))
             for n in (a, b)} if not include_stale else {}
    gone = [n for n in (a, b) if stale.get(n) and not any(r.model == n for r in records)]
    if gone and len(gone) == len({a, b}):
        raise EvidenceError(f"every record of {' and '.join(gone)} on {metric} is stale: it measured other weights "
                            "than the name has now (sha256 changed); record new runs, or compare the old ones "
                            "with --stale")
    if target is not None and target not in (known := sub_keys(records, [a, b])):
        raise EvidenceError(f"--target {target}: {a} and {b} recorded no such sub-score of {metric}; known: "
                            f"{', '.join(known) or 'none'}")
    out = compare_records(a, b, records, metric=metric, higher_is_better=ledger.direction(metric),
                          confidence=confidence, detect=detect, min_runs=min_runs, target=target, margins=margin,
                          margin_source="--margin", replicates=replicates,
                          env=chosen.to_dict() if chosen else None).to_dict()
    out["reasons"] += [f"{n}: its {stale[n]} record(s) on {metric} are stale (they measured other weights; --stale "
                       "shows them)" for n in gone]
    return out


def calibrate_metrics(ledger: Ledger, proxy: str, target: str, *,
                      current_sha: Mapping[str, str | None] | None = None, env: EnvChoice | None = None,
                      **options) -> dict:
    """``vecmerge evidence calibrate --proxy P --target T [--min-models N] [--env ID|K=V ...]``:
    ``Calibration.to_dict()`` with ``environments`` (proxy and target: the one environment each was measured
    under; several for one metric are refused, naming the fields: ``--env`` picks, an id per metric)."""
    _check_known(ledger, [], proxy)
    _check_known(ledger, [], target)
    records = ledger.records(current_sha=current_sha)
    used, chosen = [], {}
    for metric in (proxy, target):
        e, recs = one_environment([r for r in records if r.metric == metric], env, f"calibrate: {metric}")
        used += recs
        chosen[metric] = e.to_dict() if e else None
    out = calibrate_records(used, proxy, target, directions=ledger.directions(), **options).to_dict()
    return {**out, "environments": chosen}


def _one_environment_each(records, metrics, env, what: str) -> tuple[list, dict]:
    """The records of ``metrics``, each metric in its one eval environment (``environment.one_environment``), and
    ``{metric: that environment's dict}``."""
    used, chosen = [], {}
    for metric in metrics:
        e, recs = one_environment([r for r in records if r.metric == metric], env, f"{what}: {metric}")
        used += recs
        chosen[metric] = e.to_dict() if e else None
    return used, chosen


def calibrate_loo_metrics(ledger: Ledger, proxies: Sequence[str], target: str, *,
                          current_sha: Mapping[str, str | None] | None = None, env: EnvChoice | None = None,
                          **options) -> dict:
    """``vecmerge evidence calibrate --proxy P1[,P2...] --target T --loo [--env ...]``: ``HeldOutCalibration.to_dict()``
    with ``environments`` (each metric in one eval environment, as ``calibrate_metrics``)."""
    for metric in (*proxies, target):
        _check_known(ledger, [], metric)
    used, chosen = _one_environment_each(ledger.records(current_sha=current_sha), (*proxies, target), env, "calibrate")
    out = calibrate_loo_records(used, list(proxies), target, directions=ledger.directions(), **options).to_dict()
    return {**out, "environments": chosen}


def rank(ledger: Ledger, candidates: Sequence[str], proxies: Sequence[str], target: str | None = None, *,
         current_sha: Mapping[str, str | None] | None = None, env: EnvChoice | None = None, **options) -> dict:
    """``vecmerge rank CANDIDATES... --proxy P [--target T] [--env ...]``: ``ranking.rank_candidates`` over the ledger.

    Each candidate's value of a proxy is the mean of its current whole runs (``vecmerge probe`` writes one); with a
    target, the proxies are calibrated leave-one-model-out on the past models (the candidates left out) first. Each
    metric is read in one eval environment, as ``calibrate_metrics`` reads it.

    Returns:
        dict: ``Ranking.to_dict()`` with ``environments``.
    """
    metrics = (*proxies, *([target] if target else []))
    for metric in metrics:
        _check_known(ledger, [], metric)
    records, chosen = _one_environment_each(ledger.records(current_sha=current_sha), metrics, env, "rank")
    means = {p: {m: sum(v) / len(v) for m, v in runs_by_model(r for r in records if r.metric == p).items()}
             for p in proxies}
    missing = [f"{c} ({p})" for p in proxies for c in candidates if c not in means[p]]
    if missing:
        raise EvidenceError(f"no current whole-run record of {', '.join(missing[:4])}"
                            f"{' and more' if len(missing) > 4 else ''} in {ledger.path}; record it first "
                            "(vecmerge probe CANDIDATE --prompts FILE, or evidence add)")
    values = {p: {c: means[p][c] for c in candidates} for p in proxies}
    history = {p: {m: v for m, v in means[p].items() if m not in values[p]} for p in proxies}
    calibration = None
    if target is not None:
        calibration = calibrate_loo_records(records, list(proxies), target, directions=ledger.directions(),
                                            exclude=candidates, **options)
    out = rank_candidates(values, history=history, calibration=calibration, directions=ledger.directions())
    return {**out.to_dict(), "environments": chosen}


def ls_rows(entries: Mapping[str, Mapping], ledger: Ledger | None, *, metric: str | None = None) -> list[dict]:
    """``vecmerge ls``: one row per workspace entry.

    Args:
        entries: name -> ``{"path", "sha256", "base_model", "parent"}`` (the caller reads the workspace).
        ledger (Ledger | None): the evidence ledger (None: no runs column).
        metric (str | None): the default metric for ``runs`` and ``mean``.

    Returns:
        list[dict]: ``{"name", "path", "sha256", "sha256_short", "base_model", "parent", "runs", "mean",
        "stale", "environments"}`` with runs / mean / stale over current whole-run records of ``metric`` (None
        without one); ``mean`` is None when the runs were made under several eval environments (never pooled).
    """
    current = {n: e.get("sha256") for n, e in entries.items()}
    records = (ledger.records(list(entries), metric, current_sha=current, include_stale=True)
               if ledger is not None and metric else [])
    fresh = [r for r in records if not r.stale and not r.is_item]
    old = runs_by_model(r for r in records if r.stale)
    rows = []
    for name, e in entries.items():
        sha = e.get("sha256")
        mine = [r for r in fresh if r.model == name]
        runs, envs = [r.value for r in mine], len(environments(mine))
        rows.append({"name": name, "path": e.get("path"), "sha256": sha, "sha256_short": sha[:12] if sha else None,
                     "base_model": e.get("base_model"), "parent": e.get("parent"),
                     "runs": len(runs) if metric else None,
                     "mean": sum(runs) / len(runs) if runs and envs == 1 else None,
                     "stale": len(old.get(name, [])) if metric else None, "environments": envs if metric else None})
    return rows


def plan(ledger: Ledger, a: str, b: str, *, metric: str, min_effect: float, max_runs: int, alpha: float = 0.05,
         current_sha: Mapping[str, str | None] | None = None) -> dict:
    """``vecmerge evidence plan A --vs B --metric M --min-effect D --max-runs N [--alpha 0.05]``: record a plan.

    The metric's direction must be declared; the ledger's pooled noise now sets the prior scale (D / sd), over
    the eval environment of A's and B's runs (pooled over all models' runs only where one environment holds all).
    Returns ``{"plan": Plan.to_dict(), "looks_from": record id}``: runs recorded after it are its looks.
    """
    direction = ledger.direction(metric)
    if direction is None:
        raise EvidenceError(f"{metric}: no direction recorded; declare it first (evidence add ... "
                            "--higher-is-better, or evidence import --higher-is-better METRIC)")
    current = current_sha or {}
    records = ledger.records(metric=metric, current_sha=current_sha)
    envs = environments(r for r in records if r.model in (a, b)) or environments(records)
    if len(envs) == 1:
        env_id = next(iter(envs))
        records = [r for r in records if r.environment.id == env_id]
    noise = pooled_noise(runs_by_model(records)) if len(environments(records)) <= 1 else None
    sd = noise.sd if noise is not None and noise.sd > 0 else None
    made = ledger.add_plan(Plan(0, a, b, metric, current.get(a), current.get(b), min_effect, max_runs, alpha,
                                direction, sd, min_effect / sd if sd else 1.0, TEST))
    return {"plan": made.to_dict(), "looks_from": made.after_record + 1}


def check_plan_weights(p: Plan, current_sha) -> None:
    """Raise when A or B of plan ``p`` now has other weights than the plan names."""
    for name, planned in ((p.a, p.a_sha256), (p.b, p.b_sha256)):
        now = (current_sha or {}).get(name, planned)
        if now != planned:
            raise EvidenceError(f"plan {p.id}: {name} now has other weights (sha256 {str(now)[:12]}, the plan's "
                                f"{str(planned)[:12]}); record a new plan for these weights")


def plan_looks(p: Plan, records, env: EnvChoice | None) -> list:
    """The records that are plan ``p``'s looks, in one eval environment (several: refused, naming the fields)."""
    ids = {rid for _, _, rid in plan_runs(p, records)}
    looks = [r for r in records if r.id in ids]
    _, kept = one_environment(looks, env, f"plan {p.id} ({p.a} --vs {p.b} on {p.metric})")
    return kept


def decide(ledger: Ledger, a: str, b: str, metric: str | None = None, *,
           current_sha: Mapping[str, str | None] | None = None, replay: bool = False,
           env: EnvChoice | None = None) -> dict:
    """``vecmerge evidence decide A --vs B [--metric M] [--replay] [--env ID|K=V]``: the latest plan's anytime-valid
    decision over its looks, in one eval environment.

    Returns:
        dict: ``{"decision": stop_better | stop_futile | continue, "plan": Plan.to_dict(), "reason", "runs",
        "after_stop", "beyond_max", "more_runs", "last": Look.to_dict(), "looks": [...] (replay only)}``.
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
    check_plan_weights(latest, current_sha)
    looks = plan_looks(latest, ledger.records([a, b], latest.metric, include_stale=True), env)
    decision = decide_plan(latest, looks)
    return {"decision": decision.decision, "plan": latest.to_dict(), "plans": len(plans),
            **{k: v for k, v in decision.to_dict(replay).items() if k != "decision"}}
