"""``vecmerge evidence add``, ``import`` and ``export``: records into the ledger and out of it, all or nothing.

The ledger operations (``add``, ``import_``, ``export_lines``) take a ``Ledger`` and return JSON-ready data;
the commands (``evidence_*``) take the workspace and the request, and print the report.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from json.encoder import encode_basestring_ascii
from typing import Any

from ..errors import UsageError
from ..evidence import EvidenceError
from ..evidence.importers.importers import Imported, export_csv_lines, import_files
from ..evidence.ledger.environment import canonical_fields
from ..evidence.ledger.ledger import Entry, Ledger
from ..evidence.ledger.precision import check_decimals, decimals_of
from ..evidence.ledger.precision import note as note_decimals
from ..evidence.ledger.precision import write as write_decimals
from ..evidence.ledger.suggest import close_name
from ..io.parse import Written
from ..report import evidence as report_evidence
from ..requests import EvidenceAdd, EvidenceExport, EvidenceImport
from ..workspace.names import Workspace
from .printing import Echo, ledger_of, say

__all__ = ["add", "import_", "export", "export_lines", "evidence_add", "evidence_import", "evidence_export"]


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
    entries = [Entry(name, metric, v, sha256, tuple(sorted(s.items())), note=note, env=fields)
               for v, s in zip(values, per_run)]
    written: dict = {}
    series: list[tuple[str | None, list]] = [(None, values), *((k, [r[k] for r in per_run]) for k in (subs or {}))]
    for sub, given in series:
        for v in given:
            note_decimals(written, metric, sub, check_decimals(decimals) if decimals is not None else
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
            env: Mapping[str, str] | None = None, decimals: int | None = None) -> Imported:
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


def evidence_add(ws: Workspace, req: EvidenceAdd, *, echo: Echo = print) -> dict:
    """``vecmerge evidence add NAME VALUE... --metric M``: record runs, tied to NAME's current content sha256.

    NAME: a workspace name or folder (else recorded without a hash); the metric defaults to the workspace's
    ``metric:``; ``--decimals``: the decimals the values are written with (default: their text).
    """
    metric = req.metric or ws.metric
    if metric is None:
        raise UsageError("evidence add: name the metric with --metric M (or set metric: in vecmerge.yaml)")
    out = add(ledger_of(ws), req.name, list(req.values), metric=metric, sha256=ws.content_sha(req.name),
              subs=dict(req.subs) or None, note=req.note, higher_is_better=req.higher_is_better, env=dict(req.env),
              workspace_names=ws.adapters, external=req.external, decimals=req.decimals)
    say(echo, out, report_evidence.render_add, req.as_json)
    return out


def evidence_import(ws: Workspace, req: EvidenceImport, *, echo: Echo = print) -> dict:
    """``vecmerge evidence import FILE...``: CSV, lm-eval results JSON, --log_samples JSONL; all or nothing.

    Each record is tied to its model's current content sha256 (names that are no adapter here: none); lm-eval's
    model paths are matched to the workspace's adapters (relative to the results file and to the workspace).
    The request's directions are declared in the same transaction; its ``--env`` fields are added to every
    record's eval environment.
    """
    out: dict[str, Any] = {**import_(ledger_of(ws), list(req.files), current_sha=ws.content_sha, model=req.model,
                  cluster_field=req.cluster_field, task=req.task, directions=req.directions, adapters=ws.adapters,
                  home=ws.home, env=dict(req.env), decimals=req.decimals)}
    out["unhashed"] = [m for m in out["models"] if ws.content_sha(m) is None]
    say(echo, out, report_evidence.render_import, req.as_json)
    return out


CHUNK = 1 << 20  # characters an export holds before it writes them


def evidence_export(ws: Workspace, req: EvidenceExport, *, echo: Echo = print) -> int:
    """``vecmerge evidence export --format csv|json``: every record, stale ones flagged, streamed to stdout in
    pieces of about 1 MiB (a ledger of millions of records is never held as one text).

    Returns:
        int: the characters written.
    """
    ledger = ledger_of(ws)
    rest, total = "", 0
    for piece in export_lines(ledger, req.format, current_sha=ws.current_shas(ledger.models())):
        rest += piece
        if len(rest) >= CHUNK and (cut := rest.rfind("\n")) >= 0:  # whole lines; echo adds the line break
            echo(rest[:cut])
            total, rest = total + cut + 1, rest[cut + 1:]
    if rest.strip("\n") or not total:
        echo(rest.rstrip("\n"))
    return total + len(rest)
