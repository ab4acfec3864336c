"""Read evaluations from CSV, lm-evaluation-harness results JSON and its ``--log_samples`` JSONL files.

Every file is parsed completely before anything is written; all entries of one import go to the ledger in ONE
transaction. A malformed input raises one EvidenceError line naming the file, the row (1-based line, or the
JSON path) and the field, with a count of any further problems. CSV: ``model,metric,value`` and optionally
``note``, ``stderr``, ``item``, ``cluster``, ``subscore``, ``sha256``, ``sub.KEY`` and ``env.KEY`` columns
(an export's ``id``, ``source``, ``created``, ``stale``, ``env_id`` are ignored; a spreadsheet-quoted cell is
read without its quote). The lm-eval readers live in ``lm_eval.py``. The formats in full:
docs/design/evidence.md.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TypedDict

from ...io.files import open_regular
from ...io.parse import short
from ...io.safe_text import printable, spreadsheet_cell, spreadsheet_text
from .. import EvidenceError
from ..ledger.environment import canonical_fields, canonical_value, key_problem
from ..ledger.ledger import Ledger
from ..ledger.precision import check_decimals, decimals_of
from ..ledger.precision import note as note_decimals
from ..ledger.precision import write as write_decimals
from ..ledger.records import SHA_RE, Entry
from .lm_eval import lm_eval_model, metric_name, parse_lm_eval_results, parse_lm_eval_samples
from .lm_eval_groups import group_items
from .lm_eval_tree import expand, match_samples
from .parsing import Parsed, Problems, parse_number, plain

__all__ = ["parse_csv", "parse_lm_eval_results", "parse_lm_eval_samples", "lm_eval_model", "metric_name",
           "detect_kind", "parse_files", "import_files", "export_csv_text", "export_csv_lines", "Parsed",
           "CSV_COLUMNS"]

CSV_COLUMNS = ("model", "metric", "value", "note", "stderr", "item", "cluster", "sha256", "subscore")
CSV_IGNORED = ("id", "source", "created", "stale", "env_id")


def parse_csv(path: str | Path) -> Parsed:
    """Entries from a CSV file (see the module docstring for the columns); raises on any malformed row.

    Args:
        path (str | Path): the file; UTF-8 (a BOM is accepted).
    """
    path = Path(path)
    problems = Problems(path)
    try:
        with open_regular(path) as f:
            text = f.read().decode("utf-8-sig").replace("\r\n", "\n").replace("\r", "\n")  # as text mode reads
    except (OSError, UnicodeDecodeError) as err:
        raise EvidenceError(f"{path}: cannot read the CSV file ({err}); nothing was recorded") from err
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = [h.strip() for h in next(reader)]
    except StopIteration:
        raise EvidenceError(f"{path}: line 1: empty file, expected a header model,metric,value; "
                            "nothing was recorded") from None
    for i, name in enumerate(header):
        if name.startswith("env.") and (p := key_problem(name[4:])) is not None:
            problems.add("line 1", name, p)
        elif name not in CSV_COLUMNS and name not in CSV_IGNORED and not (
                name.startswith(("sub.", "env.")) and name[4:]):
            problems.add("line 1", name, f"unknown column; use model, metric, value, {', '.join(CSV_COLUMNS[3:])}, "
                                         "sub.KEY or env.KEY")
        elif name in header[:i]:
            problems.add("line 1", name, "column given twice")
    for name in ("model", "metric", "value"):
        if name not in header:
            problems.add("line 1", name, "missing column (the header needs model, metric and value)")
    problems.raise_if_any()

    entries, start = [], reader.line_num + 1
    decimals: dict = {}
    source = f"csv:{path}"
    try:
        for row in reader:
            where, start = f"line {start}", reader.line_num + 1
            if not any(cell.strip() for cell in row):
                continue
            if len(row) != len(header):
                problems.add(where, None, f"{len(row)} fields, the header has {len(header)}")
                continue
            cells = {name: spreadsheet_text(cell) for name, cell in zip(header, row)}
            model = plain(cells["model"], problems, where, "model", True)
            metric = plain(cells["metric"], problems, where, "metric", True)
            value = parse_number(cells["value"].strip(), problems, where, "value")
            stderr = item = cluster = sha = note = None
            if (s := cells.get("stderr", "").strip()):
                stderr = parse_number(s, problems, where, "stderr")
                if stderr is not None and stderr < 0:
                    problems.add(where, "stderr", f"{short(s)} is negative")
            item = plain(cells.get("item", ""), problems, where, "item", False)
            cluster = plain(cells.get("cluster", ""), problems, where, "cluster", False)
            subscore = plain(cells.get("subscore", ""), problems, where, "subscore", False)
            if cluster is not None and item is None:
                problems.add(where, "cluster", "a cluster key needs an item id in the same row")
            if subscore is not None and item is None:
                problems.add(where, "subscore", "names the sub-score of an item; a run's sub-scores go in sub.KEY "
                                                "columns")
            if (s := cells.get("sha256", "").strip()):
                if SHA_RE.match(s):
                    sha = s
                else:
                    problems.add(where, "sha256", f"{short(s)} is not 64 lowercase hex digits")
            note = cells.get("note", "").strip() or None
            subs, env, bad_env = {}, {}, False
            for name in header:
                if name.startswith("sub.") and cells[name].strip():
                    subs[name[4:]] = parse_number(cells[name].strip(), problems, where, name)
                elif name.startswith("env."):
                    try:
                        env[name[4:]] = canonical_value(cells[name], name)
                    except EvidenceError as err:
                        problems.add(where, name, str(err).split(": ", 1)[-1])
                        bad_env = True
            given = {k: v for k, v in subs.items() if v is not None}
            if model is None or metric is None or value is None or len(given) < len(subs) or bad_env:
                continue
            entries.append(Entry(model, metric, value, sha, tuple(sorted(given.items())), stderr, item, cluster,
                                 source, note, subscore, canonical_fields(env)))
            if item is None:  # grades are read from whole runs: the decimals their cells are written with
                note_decimals(decimals, metric, None, decimals_of(cells["value"]))
                for key in subs:
                    note_decimals(decimals, metric, key, decimals_of(cells[f"sub.{key}"]))
    except csv.Error as err:
        problems.add(f"line {reader.line_num}", None, f"not valid CSV ({err})")
    problems.raise_if_any()
    return Parsed(entries, {}, [str(path)], decimals=decimals)


def detect_kind(path: str | Path) -> str:
    """``csv``, ``results`` or ``samples`` from the file name (``.csv``, ``.json``, ``.jsonl``)."""
    suffix = Path(path).suffix.lower()
    kinds = {".csv": "csv", ".json": "results", ".jsonl": "samples"}
    if suffix not in kinds:
        raise EvidenceError(f"{path}: unknown kind of file; use .csv, an lm-eval results .json or a "
                            "samples .jsonl")
    return kinds[suffix]


def parse_files(paths: Iterable[str | Path], *, model: str | None = None, cluster_field: str | None = None,
                task: str | None = None, adapters: Mapping[str, Path] | None = None, home: Path | None = None,
                env: Mapping[str, str] | None = None, decimals: int | None = None) -> Parsed:
    """Parse every file (kind from its suffix; a folder: the lm-eval files under it, ``lm_eval_tree.expand``)
    before anything is written. A samples file takes the model, the eval environment of its task and the groups
    of the results file of its run (``lm_eval_tree.match_samples``); unmatched, the model of the results given
    with it when those name exactly one. Each group gets its leaf tasks' items (``lm_eval_groups.group_items``).

    Args:
        adapters, home: the workspace's adapters and folder (``lm_eval.lm_eval_model`` matches lm-eval's model
            paths to them).
        env (Mapping[str, str] | None): environment fields added to every entry (``--env KEY=VALUE``); one a file
            already gives with another value is refused.
        decimals (int | None): the decimals every value and sub-score is written with (``--decimals``), in place
            of those read from the files' text.
    """
    paths = expand(paths)
    if not paths:
        raise EvidenceError("no file to import")
    out = Parsed()
    kinds = {p: detect_kind(p) for p in paths}
    runs: dict[Path, Parsed] = {}
    for p in paths:
        if kinds[p] == "results":
            part = runs[p] = parse_lm_eval_results(p, model, adapters=adapters, home=home)
        elif kinds[p] == "csv":
            part = parse_csv(p)
        else:
            continue
        out.entries += part.entries
        out.directions.update(part.directions)
        for (metric, sub), n in part.decimals.items():
            note_decimals(out.decimals, metric, sub, n)
    results = [e for e in out.entries if e.source.startswith("lm-eval:")]
    result_models = {e.model for e in results}
    groups = {k: v for run in runs.values() for k, v in run.groups.items()}
    matched = match_samples(list(runs), [p for p in paths if kinds[p] == "samples"])
    for p, run_file in matched.items():
        run = runs.get(run_file) if run_file is not None else None
        mine = run.entries if run is not None else results
        sample_model = model or (mine[0].model if run is not None else next(iter(result_models))
                                 if len(result_models) == 1 else None)
        task_env = {(e.model, e.metric.split("/")[0]): e.env for e in mine}
        part = parse_lm_eval_samples(p, sample_model, task=task, cluster_field=cluster_field)
        items = [replace(e, env=task_env.get((e.model, e.metric.split("/")[0]), ())) for e in part.entries]
        out.entries += items + group_items(items, run.groups if run is not None else groups)
    if env:
        extra = canonical_fields(env, "--env")
        for e in out.entries:
            clash = [k for k, v in extra if dict(e.env).get(k, v) != v]
            if clash:
                raise EvidenceError(f"--env {clash[0]}={dict(extra)[clash[0]]}: {e.source.split(':', 1)[-1]} records "
                                    f"{clash[0]}={dict(e.env)[clash[0]]} for {e.model} on {e.metric}; drop the "
                                    "option or fix the file; nothing was recorded")
        out.entries = [replace(e, env=canonical_fields({**dict(e.env), **dict(extra)})) for e in out.entries]
    if decimals is not None:
        check_decimals(decimals)
        out.decimals = {(e.metric, k): decimals for e in out.entries if e.item is None
                        for k in (None, *dict(e.subs))}
    out.files = [str(p) for p in paths]
    return out


class Imported(TypedDict):
    """What ``import_files`` recorded, as the JSON of ``evidence import`` reads."""

    files: list[str]
    records: int
    ids: list[int]  # [first, last], empty when nothing new was recorded
    models: list[str]
    metrics: list[str]
    item_level: int
    directions: dict[str, bool]
    environments: dict[str, dict[str, str]]  # environment id -> its fields (empty: none recorded)
    duplicates: list[dict]  # {"file", "same_as"}: files whose content was imported before


def import_files(ledger: Ledger, paths: Iterable[str | Path], *,
                 sha_of: Mapping[str, str | None] | Callable[[str], str | None] | None = None,
                 model: str | None = None, cluster_field: str | None = None, task: str | None = None,
                 directions: Mapping[str, bool] | None = None, adapters: Mapping[str, Path] | None = None,
                 home: Path | None = None, env: Mapping[str, str] | None = None, decimals: int | None = None
                 ) -> Imported:
    """Parse all ``paths``, fill each entry's sha256 from ``sha_of`` (where the file carried none) and
    write everything in one transaction.

    Args:
        ledger (Ledger): where to record.
        paths: the files (.csv, lm-eval results .json, samples .jsonl).
        sha_of: model name -> its current content sha256 (a mapping or a function); None leaves them unhashed.
        model, cluster_field, task, adapters, home, env, decimals: see ``parse_files``.
        directions (Mapping[str, bool] | None): metric -> higher_is_better to declare in the same transaction
            (a CSV carries none); one that contradicts a file's own declaration raises, nothing written.

    Returns:
        Imported: ``{"files": [...], "records": int, "ids": [first, last], "models": [...], "metrics": [...],
        "item_level": int, "directions": {metric: higher_is_better}, "environments": {id: fields},
        "duplicates": [...]}``.
    """
    parsed = parse_files(paths, model=model, cluster_field=cluster_field, task=task, adapters=adapters, home=home,
                         env=env, decimals=decimals)
    for metric, higher in (directions or {}).items():
        if parsed.directions.get(metric, higher) != higher:
            raise EvidenceError(f"{metric}: the files say {'higher' if parsed.directions[metric] else 'lower'} "
                                "is better, the option the opposite; nothing was recorded")
        parsed.directions[metric] = higher
    look = sha_of.get if isinstance(sha_of, Mapping) else (sha_of or (lambda name: None))
    kept, duplicates = _first_imports(ledger, parsed.entries)
    entries = [e if e.sha256 is not None else replace(e, sha256=look(e.model)) for e in kept]
    ids = ledger.write(entries, parsed.directions, also=lambda con, now: write_decimals(con, parsed.decimals))
    envs = {e.environment.id: dict(e.env) for e in entries}
    return {"files": parsed.files, "records": len(ids), "ids": [ids[0], ids[-1]] if ids else [],
            "models": sorted({e.model for e in entries}), "metrics": sorted({e.metric for e in entries}),
            "item_level": sum(e.item is not None for e in entries), "directions": parsed.directions,
            "environments": envs if any(envs.values()) else {}, "duplicates": duplicates}


def _content(source: str) -> tuple[str, str] | None:
    """(file, content sha256) of an ``lm-eval:FILE@SHA256`` source; None for any other source."""
    if not source.startswith("lm-eval:") or "@" not in source:
        return None
    file, _, sha = source[len("lm-eval:"):].rpartition("@")
    return (file, sha) if SHA_RE.match(sha) else None


def _first_imports(ledger: Ledger, entries: list[Entry]) -> tuple[list[Entry], list[dict]]:
    """``entries`` less those of an lm-eval file whose content the ledger already holds or an earlier file of
    this import has (the same results file imported twice counts once), and ``[{"file", "same_as"}]``."""
    held = {c[1]: c[0] for (source,) in ledger._read("SELECT DISTINCT source FROM records WHERE source LIKE "
                                                     "'lm-eval:%'") if (c := _content(source))}
    first: dict[str, str] = {}
    duplicates: dict[str, str] = {}
    kept = []
    for e in entries:
        c = _content(e.source)
        if c is not None:
            file, sha = c
            if sha in held:
                duplicates.setdefault(file, f"{held[sha]} (in the ledger already)")
                continue
            if first.setdefault(sha, file) != file:
                duplicates.setdefault(file, first[sha])
                continue
        kept.append(e)
    return kept, [{"file": f, "same_as": s} for f, s in duplicates.items()]


def export_csv_text(rows: Iterable[dict]) -> str:
    """CSV text of ``Ledger.export()`` rows, readable again by ``parse_csv`` (sub-scores as ``sub.KEY``, the eval
    environment as ``env.KEY``).

    Every text cell is shown safely: control and escape characters removed (``io.safe_text.printable``) and
    a spreadsheet formula neutralised (``io.safe_text.spreadsheet_cell``: ``=HYPERLINK(...)`` becomes
    ``'=HYPERLINK(...)``, which ``parse_csv`` reads back without the quote).
    """
    rows = list(rows)
    subs = sorted({k[4:] for r in rows for k in r if k.startswith("sub.")})
    envs = sorted({k[4:] for r in rows for k in r if k.startswith("env.")})
    return "".join(export_csv_lines(rows, subs, envs, any(r.get("subscore") for r in rows)))


def export_csv_lines(rows: Iterable[dict], subs: Sequence[str], envs: Sequence[str], subscore: bool) -> Iterator[str]:
    """``export_csv_text`` one line at a time, its columns given (a ledger streamed: ``Ledger.export_columns``).

    Args:
        rows (Iterable[dict]): ``Record.to_dict()`` rows. subs, envs (Sequence[str]): the sub-score and environment
            keys, sorted. subscore (bool): whether the ``subscore`` column is written.
    """
    columns = ["model", "metric", "value", "stderr", "item", "cluster", "note", "sha256", "source", "created",
               "stale", "id", *(["subscore"] if subscore else []), *(f"sub.{k}" for k in subs),
               *(["env_id"] if envs else []), *(f"env.{k}" for k in envs)]
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")

    def line(cells: Iterable[str]) -> str:
        buf.seek(0)
        buf.truncate()
        writer.writerow(cells)
        return buf.getvalue()

    yield line([spreadsheet_cell(printable(c)) for c in columns])
    texts: dict[str, str] = {}  # a text cell as written: models, metrics, hashes and times repeat row after row
    for r in rows:
        cells = []
        for c in columns:
            value = r.get(c)
            if type(value) is str:
                shown = texts.get(value)
                if shown is None:
                    if len(texts) >= 1 << 16:
                        texts.clear()
                    shown = texts[value] = _cell(value)
                cells.append(shown)
            else:
                cells.append(_cell(value))
        yield line(cells)


def _cell(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, (bool, int)):
        return str(value)
    return spreadsheet_cell(printable(value))
