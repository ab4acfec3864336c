"""The evidence commands that record and read the ledger: ``add``, ``import``, ``export``, ``show`` and ``ls``'s rows.

Each returns JSON-ready data (the CLI only parses flags and prints); ``operations`` gathers them with the
others. ``check_known`` is the refusal every reading command shares: names or a metric the ledger never saw.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from json.encoder import encode_basestring_ascii

from ..evidence import EvidenceError
from ..evidence.importers.importers import export_csv_lines, import_files
from ..evidence.judge.subscores import sub_runs
from ..evidence.ledger.environment import EnvChoice, canonical_fields, environments
from ..evidence.ledger.item_groups import ItemGroup, distinct_items, item_groups
from ..evidence.ledger.ledger import Entry, Ledger
from ..evidence.ledger.precision import check_decimals, decimals_of
from ..evidence.ledger.precision import note as note_decimals
from ..evidence.ledger.precision import read as read_decimals
from ..evidence.ledger.precision import write as write_decimals
from ..evidence.ledger.suggest import close_name
from ..evidence.stats.grades import detect_grid
from ..evidence.stats.replicates import components, members, trainings
from ..evidence.stats.stats import runs_by_model, summarize_records
from ..io.parse import Written

__all__ = ["add", "import_", "export", "export_lines", "show", "ls_rows", "check_known"]


def add(ledger: Ledger, name: str, values: Sequence[float], *, metric: str, sha256: str | None,
        subs: Mapping[str, float | Sequence[float]] | None = None, note: str | None = None,
        higher_is_better: bool | None = None, env: Mapping[str, str] | None = None,
        workspace_names: Iterable[str] = (), external: bool = False, decimals: int | None = None) -> dict:
    """``vecmerge evidence add NAME VALUE... --metric M [--sub K=V[,V...]] [--env K=V] [--decimals N] [--note]
    [--higher-is-better]``.

    One transaction: the runs, and the metric's direction when given. A NAME that is no adapter here
    (``sha256`` None) is an external model, unless it is within ``suggest.close_name`` of a workspace name and
    new to the ledger: that is refused with "did you mean ...?" (``external`` records it anyway).

    Args:
        subs: sub-score -> one value per run (a list as long as ``values``; a single number for a single run).
        env: the runs' eval environment fields (``environment.py``).
        workspace_names: the workspace's adapter names (for the typo check).
        decimals (int | None): the decimals the values are written with; by default read from values given as
            text (``io.parse.Written``, as the CLI passes them), unknown for plain floats (``precision.py``).

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
    written: dict = {}
    for key, given in [(None, values), *((k, [r[k] for r in per_run]) for k in (subs or {}))]:
        for v in given:
            note_decimals(written, metric, key, check_decimals(decimals) if decimals is not None else
                 decimals_of(v.text) if isinstance(v, Written) else None)
    ids = ledger.write(entries, None if higher_is_better is None else {metric: higher_is_better},
                       also=lambda con, now: write_decimals(con, written))
    return {"model": name, "metric": metric, "sha256": sha256, "values": values, "ids": ids,
            "direction": ledger.direction(metric), "subs": {k: [r[k] for r in per_run] for k in (subs or {})},
            "env": {"id": entries[0].environment.id, "fields": dict(fields)} if entries else None,
            "external": sha256 is None and name not in names}


def import_(ledger: Ledger, paths: Iterable[str], *,
            current_sha: Mapping[str, str | None] | Callable[[str], str | None] | None = None,
            model: str | None = None, cluster_field: str | None = None, task: str | None = None,
            directions: Mapping[str, bool] | None = None, adapters=None, home=None,
            env: Mapping[str, str] | None = None, decimals: int | None = None) -> dict:
    """``vecmerge evidence import FILE... [--model NAME] [--cluster-field KEY] [--higher-is-better M] [--env K=V]``:
    ``importers.import_files`` (``current_sha``: a mapping or a function of the model name; ``adapters`` and
    ``home``: the workspace's, to match lm-eval's model paths)."""
    return import_files(ledger, paths, sha_of=current_sha or {}, model=model, cluster_field=cluster_field, task=task,
                        directions=directions, adapters=adapters, home=home, env=env, decimals=decimals)


def export(ledger: Ledger, fmt: str = "csv", *, current_sha: Mapping[str, str | None] | None = None) -> str:
    """``vecmerge evidence export --format csv|json``: every record (stale ones flagged) as text."""
    return "".join(export_lines(ledger, fmt, current_sha=current_sha))


def export_lines(ledger: Ledger, fmt: str = "csv", *,
                 current_sha: Mapping[str, str | None] | None = None) -> Iterator[str]:
    """``export``'s text in pieces, the ledger streamed (``Ledger.iter_records``): the columns come from one SQL
    pass over the distinct stored cells, then each record is read, written and dropped."""
    if fmt not in ("csv", "json"):
        raise EvidenceError(f"--format {fmt}: use csv or json")
    rows = (r.to_dict() for r in ledger.iter_records(current_sha))
    if fmt == "csv":
        yield from export_csv_lines(rows, *ledger.export_columns())
        return
    head = json.dumps(ledger.directions(), indent=2).replace("\n", "\n  ")
    yield f'{{\n  "directions": {head},\n  "records": ['
    first = True
    for row in rows:  # json.dumps(..., indent=2) of the whole, written one record at a time
        yield ("\n    " if first else ",\n    ") + _record_json(row)
        first = False
    yield ("]" if first else "\n  ]") + "\n}\n"


def _scalar_json(value) -> str:
    if type(value) is str:
        return encode_basestring_ascii(value)
    if type(value) is float and math.isfinite(value):
        return repr(value)
    if value is None or type(value) in (bool, int):
        return json.dumps(value)
    raise TypeError(type(value).__name__)


def _record_json(row: dict) -> str:
    """``json.dumps(row, indent=2)`` indented by 4 more spaces, for a flat row (the C encoder per value: the
    indenting encoder is pure Python, a tenth of the speed); anything but a flat row goes through json.dumps."""
    try:
        body = ",\n      ".join(f"{encode_basestring_ascii(k)}: {_scalar_json(v)}" for k, v in row.items())
    except TypeError:
        return json.dumps(row, indent=2).replace("\n", "\n    ")
    return "{\n      " + body + "\n    }" if row else "{}"


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
    both = sorted([*every, *groups], key=lambda x: x.id)  # record order: a group sits at its first record
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
        series = {None: [v for vs in runs_by_model(mine).values() for v in vs]}
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
