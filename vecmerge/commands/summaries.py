"""``vecmerge evidence show`` and ``vecmerge ls``: the ledger summarized, per model, environment and workspace entry.

``check_known`` is the refusal every reading command shares: names or a metric the ledger never saw.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from ..errors import VecmergeError
from ..evidence import EvidenceError
from ..evidence.judge.subscores import sub_runs
from ..evidence.ledger.environment import EnvChoice, environments
from ..evidence.ledger.item_groups import ItemGroup, distinct_items, item_groups
from ..evidence.ledger.ledger import Ledger
from ..evidence.ledger.precision import read as read_decimals
from ..evidence.ledger.records import Record
from ..evidence.stats.grades import detect_grid
from ..evidence.stats.replicates import components, members, trainings
from ..evidence.stats.stats import runs_by_model, summarize_records
from ..io.parse import ParseError, load_json
from ..outputs.transaction import PNG, OutputPolicy, write_file
from ..peft.format import CONFIG_NAME
from ..report import evidence as report_evidence
from ..requests import EvidenceShow, Ls
from ..workspace.base_model import declared_base
from ..workspace.names import Workspace
from .printing import Echo, ledger_of, say, show_path

__all__ = ["check_known", "show", "ls_rows", "evidence_show", "ls"]


def check_known(ledger: Ledger, names: Iterable[str], metric: str | None) -> None:
    """Refuse names with no records in the ledger, and a metric it never recorded (naming the known ones)."""
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
    check_known(ledger, names or [], metric)
    choice = env or EnvChoice()
    # whole runs as records; item-level records (nearly all of an item-level ledger) as counted groups
    every = [r for r in ledger.records(names, metric, current_sha=current_sha, include_stale=True, level="run")
             if choice.matches(r.environment)]
    groups = [g for g in item_groups(ledger, names, metric, current_sha=current_sha) if choice.matches(g.environment)]
    used = [r for r in every if include_stale or not r.stale]
    both: list[Record | ItemGroup] = sorted([*every, *groups], key=lambda x: x.id)  # a group sits at its first
    # record, in record order
    stale: dict[tuple[str, str], tuple[list, set]] = {}
    for x in both:
        if x.stale:
            count, shas = stale.setdefault((x.model, x.metric), ([0], set()))
            count[0] += x.records if isinstance(x, ItemGroup) else 1
            shas.add(x.sha256 or "")
    items: dict[tuple[str, str], list] = {}
    envs: dict[str, tuple] = {}  # id -> (Environment, runs, records, models, metrics), in record order
    for x in both:
        if x.stale and not include_stale:
            continue
        e = x.environment
        _, runs, n, models, metrics = envs.setdefault(e.id, (e, [], [0], set(), set()))
        n[0] += x.records if isinstance(x, ItemGroup) else 1
        models.add(x.model)
        metrics.add(x.metric)
        if isinstance(x, ItemGroup):
            items.setdefault((x.model, x.metric), []).append(x)
        else:
            runs.append(x)
    return {
        "summaries": [s.to_dict() for s in summarize_records(used, confidence=confidence)],
        "environments": [{**e.to_dict(), "records": n[0], "models": sorted(models), "metrics": sorted(metrics)}
                         for e, _, n, models, metrics in envs.values()],
        "by": by,
        "stale": [{"model": m, "metric": k, "records": n[0], "sha256s": sorted(shas)}
                  for (m, k), (n, shas) in stale.items()],
        "item_level": [{"model": m, "metric": k, "items": distinct_items(ledger, gs),
                        "records": sum(g.records for g in gs)} for (m, k), gs in items.items()],
        "grids": [g for e, rs, *_ in envs.values() for g in _grids(rs, e.id, read_decimals(ledger))],
        "replicates": _replicate_rows(_group_records(ledger, names, used, metric, current_sha, include_stale,
                                                     choice, replicates), replicates, confidence, names),
        "directions": ledger.directions(), "include_stale": include_stale,
    }


def _grids(records, env_id: str, decimals: Mapping) -> list[dict]:
    """Every metric and sub-score whose whole-run values lie on a grid (``grades.detect_grid`` at the precision
    the ledger recorded for it, ``decimals``: (metric, sub) -> decimals)."""
    out = []
    for metric in dict.fromkeys(r.metric for r in records):
        mine = [r for r in records if r.metric == metric]
        series: dict[str | None, list[float]] = {None: [v for vs in runs_by_model(mine).values() for v in vs]}
        series.update({k: [v for vs in by_model.values() for v in vs]
                       for k, by_model in sorted(sub_runs(mine).items())})
        for sub, values in series.items():
            grid = detect_grid(values, decimals=decimals.get((metric, sub)))
            if grid is not None:
                out.append({"metric": metric, "sub": sub, "env": env_id, **grid.to_dict()})
    return out


def _group_records(ledger: Ledger, names, used, metric, current_sha, include_stale: bool, choice: EnvChoice,
                   replicates) -> list:
    """The records the replicate rows need: ``used``, and with names given, every member of their groups (so
    ``show v54`` shows v54's replicate group, not only v54's own runs)."""
    if not names or not replicates:
        return used
    wanted = sorted(members(names, replicates))
    if set(wanted) <= set(names):
        return used
    return [r for r in ledger.records(wanted, metric, current_sha=current_sha, include_stale=True, level="run")
            if choice.matches(r.environment) and (include_stale or not r.stale)]


def _replicate_rows(records, replicates, confidence: float, names=None) -> list[dict]:
    """Variance components of every replicate group (of ``names`` when given), per metric and environment."""
    out = []
    for env, recs in environments(records).values():
        for metric in dict.fromkeys(r.metric for r in recs):
            runs = runs_by_model(r for r in recs if r.metric == metric)
            for root in replicates or {}:
                if names is not None and not set(trainings(root, replicates, {})) & set(names):
                    continue
                c = components(root, replicates, runs, metric=metric, env=env.id, confidence=confidence)
                if c is not None:
                    out.append(c.to_dict())
    return out


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


def evidence_show(ws: Workspace, req: EvidenceShow, *, echo: Echo = print) -> dict:
    """``vecmerge evidence show [NAME...] [--metric M] [--stale] [--env ID|K=V] [--by env] [--plot F.png [--force]]``:
    summaries of current runs, per eval environment, and the variance components of each replicate group.

    ``--plot``: a PNG of means with their t intervals, written atomically, never over the ledger, the workspace
    file, an adapter folder or the base model, nor over an existing file unless ``--force`` and it is a PNG.
    """
    ledger = ledger_of(ws)
    policy = None
    if req.plot:  # refused before any work
        policy = OutputPolicy.for_command(inputs=[ledger.path, *([ws.file] if ws.file else [])],
                                          workspace_adapters=ws.adapters, base_model=ws.base_model, force=req.force)
        policy.check_file(req.plot, PNG, flag="--plot")
    out = show(ledger, list(req.names) or None, req.metric, current_sha=ws.current_shas(ledger.models()),
               include_stale=req.include_stale, env=EnvChoice.parse(req.env), by=req.by,
               replicates=ws.replicate_groups())
    if req.plot and policy is not None:
        write_file(req.plot, lambda f: report_evidence.plot_show(out, f), policy=policy, kind=PNG, flag="--plot")
    say(echo, out, report_evidence.render_show, req.as_json)
    if req.plot:
        echo(f"plot: {req.plot}", err=req.as_json)
    return out


def _base_model_of(folder: Path, roots=()) -> str | None:
    try:  # a stranger's file: bounded and strict
        config = load_json(folder / CONFIG_NAME)
    except ParseError:
        return None
    return declared_base(config.get("base_model_name_or_path"), roots) if isinstance(config, dict) else None


def ls(ws: Workspace, req: Ls, *, echo: Echo = print) -> dict:
    """``vecmerge ls``: every workspace entry with its sha256, base model, parent, runs and mean of the metric.

    The metric: ``--metric``, else the workspace's ``metric:``, else the ledger's only one. An entry whose
    files cannot be read is listed with the reason instead of a hash.
    """
    ledger = ledger_of(ws)
    metric = req.metric
    if metric is None:
        known = ledger.metrics()
        metric = ws.metric or (known[0] if len(known) == 1 else None)
    parents, roots = ws.lineage()
    entries, problems = {}, {}
    for name, folder in ws.adapters.items():
        try:
            sha = ws.content_sha(name)
        except VecmergeError as e:
            sha, problems[name] = None, ("missing" if not folder.exists() else "unreadable", str(e))
        entries[name] = {"path": show_path(folder), "sha256": sha, "base_model": _base_model_of(folder, (ws.home,)),
                         "parent": parents.get(name)}
    rows = ls_rows(entries, ledger if ledger.path.exists() else None, metric=metric)
    for r in rows:
        r["root"] = r["name"] in roots
        r["problem"], r["error"] = problems.get(r["name"], (None, None))
    out = {"workspace": str(ws.file) if ws.file else None, "ledger": show_path(ledger.path), "metric": metric,
           "adapters": rows}
    say(echo, out, lambda o: report_evidence.render_ls(o["adapters"], metric), req.as_json)
    return out
