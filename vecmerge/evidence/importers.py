"""Read evaluations from CSV, lm-evaluation-harness results JSON and its ``--log_samples`` JSONL files.

Every file is parsed completely before anything is written; all entries of one import go to the ledger in
ONE transaction. A malformed input raises one EvidenceError whose message is one line naming the file,
the row (1-based line number, or the JSON path) and the field, with a count of any further problems.

Formats:
    CSV        header with ``model,metric,value`` and optionally ``note``, ``stderr``, ``item``,
               ``cluster``, ``sha256`` and ``sub.KEY`` columns (one sub-score each). The columns
               ``id``, ``source``, ``created`` and ``stale`` (written by ``export_csv_text``) are ignored.
    results    lm-eval's ``results_*.json``: per task, ``"METRIC,FILTER": value`` and
               ``"METRIC_stderr,FILTER": value or "N/A"``; ``higher_is_better`` gives the directions.
    samples    lm-eval's ``samples_TASK_*.jsonl`` (``--log_samples``): one line per document with
               ``doc_id``, ``filter``, ``metrics`` (names) and one value per metric: item-level records.

Metric names: ``TASK/METRIC`` for filter ``none``, ``TASK/METRIC/FILTER`` otherwise, the same for the
results file and its samples, so a run's value is the mean of its item-level values.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from . import EvidenceError
from .ledger import SHA_RE, Entry, Ledger

CSV_COLUMNS = ("model", "metric", "value", "note", "stderr", "item", "cluster", "sha256")
CSV_IGNORED = ("id", "source", "created", "stale")
_RESULT_SKIP = ("alias", "name", "sample_len", "samples")
_SAMPLES_NAME = re.compile(r"samples_(?P<task>.+?)(?:_\d{4}-\d{2}-\d{2}T[\d.:\-]+)?\.jsonl$")


@dataclass
class Parsed:
    """What one or more files hold, ready for ``Ledger.write``.

    entries (list[Entry]): the records (sha256 filled only where the file carried it).
    directions (dict[str, bool]): metric -> higher_is_better declared by the files (lm-eval).
    files (list[str]): the files read, in order.
    """

    entries: list[Entry] = field(default_factory=list)
    directions: dict[str, bool] = field(default_factory=dict)
    files: list[str] = field(default_factory=list)


class _Problems:
    """Collects (where, field, message) for one file and raises them as one line."""

    def __init__(self, path: Path):
        self.path, self.items = path, []

    def add(self, where: str, field_name: str | None, message: str) -> None:
        self.items.append((where, field_name, message))

    def raise_if_any(self) -> None:
        if not self.items:
            return
        where, name, message = self.items[0]
        head = f"{self.path}: {where}" + (f", field '{name}'" if name else "") + f": {message}"
        if len(self.items) > 1:
            rest = [w + (f" '{f}'" if f else "") for w, f, _ in self.items[1:4]]
            more = len(self.items) - 1
            head += f" (and {more} more problem{'s' * (more > 1)}: {', '.join(rest)}{', ...' * (more > 3)})"
        raise EvidenceError(head + "; nothing was recorded")


def _number(text, problems: _Problems, where: str, name: str, *, allow_bool: bool = False) -> float | None:
    """A finite float from a cell or JSON value, or None after noting the problem."""
    if allow_bool and isinstance(text, bool):
        return float(text)
    if isinstance(text, bool) or text is None or isinstance(text, (list, dict)):
        problems.add(where, name, f"{text!r} is not a number")
        return None
    try:
        value = float(text)
    except (TypeError, ValueError):
        problems.add(where, name, f"{text!r} is not a number")
        return None
    if not math.isfinite(value):
        problems.add(where, name, f"{text!r} is not finite (NaN and infinities cannot be recorded)")
        return None
    return value


def _plain(text: str, problems: _Problems, where: str, name: str, required: bool) -> str | None:
    text = text.strip()
    if not text:
        if required:
            problems.add(where, name, "empty")
        return None
    return text


def parse_csv(path: str | Path) -> Parsed:
    """Entries from a CSV file (see the module docstring for the columns); raises on any malformed row.

    Args:
        path (str | Path): the file; UTF-8 (a BOM is accepted).
    """
    path = Path(path)
    problems = _Problems(path)
    try:
        text = path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as err:
        raise EvidenceError(f"{path}: cannot read the CSV file ({err}); nothing was recorded") from err
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = [h.strip() for h in next(reader)]
    except StopIteration:
        raise EvidenceError(f"{path}: line 1: empty file, expected a header model,metric,value; "
                            "nothing was recorded") from None
    for i, name in enumerate(header):
        if name not in CSV_COLUMNS and name not in CSV_IGNORED and not (name.startswith("sub.") and name[4:]):
            problems.add("line 1", name, f"unknown column; use model, metric, value, {', '.join(CSV_COLUMNS[3:])} "
                                         "or sub.KEY")
        elif name in header[:i]:
            problems.add("line 1", name, "column given twice")
    for name in ("model", "metric", "value"):
        if name not in header:
            problems.add("line 1", name, "missing column (the header needs model, metric and value)")
    problems.raise_if_any()

    entries, start = [], reader.line_num + 1
    source = f"csv:{path}"
    try:
        for row in reader:
            where, start = f"line {start}", reader.line_num + 1
            if not any(cell.strip() for cell in row):
                continue
            if len(row) != len(header):
                problems.add(where, None, f"{len(row)} fields, the header has {len(header)}")
                continue
            cells = dict(zip(header, row))
            model = _plain(cells["model"], problems, where, "model", True)
            metric = _plain(cells["metric"], problems, where, "metric", True)
            value = _number(cells["value"].strip(), problems, where, "value")
            stderr = item = cluster = sha = note = None
            if (s := cells.get("stderr", "").strip()):
                stderr = _number(s, problems, where, "stderr")
                if stderr is not None and stderr < 0:
                    problems.add(where, "stderr", f"{s!r} is negative")
            item = _plain(cells.get("item", ""), problems, where, "item", False)
            cluster = _plain(cells.get("cluster", ""), problems, where, "cluster", False)
            if cluster is not None and item is None:
                problems.add(where, "cluster", "a cluster key needs an item id in the same row")
            if (s := cells.get("sha256", "").strip()):
                if SHA_RE.match(s):
                    sha = s
                else:
                    problems.add(where, "sha256", f"{s!r} is not 64 lowercase hex digits")
            note = cells.get("note", "").strip() or None
            subs = {}
            for name in header:
                if name.startswith("sub.") and cells[name].strip():
                    subs[name[4:]] = _number(cells[name].strip(), problems, where, name)
            if None in (model, metric, value) or None in subs.values():
                continue
            entries.append(Entry(model, metric, value, sha, subs, stderr, item, cluster, source, note))
    except csv.Error as err:
        problems.add(f"line {reader.line_num}", None, f"not valid CSV ({err})")
    problems.raise_if_any()
    return Parsed(entries, {}, [str(path)])


def _load_json(path: Path):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise EvidenceError(f"{path}: line {err.lineno}: not valid JSON ({err.msg}); nothing was recorded") from err
    except (OSError, UnicodeDecodeError) as err:
        raise EvidenceError(f"{path}: cannot read the file ({err}); nothing was recorded") from err


def _model_args(config) -> dict:
    args = config.get("model_args") if isinstance(config, dict) else None
    if isinstance(args, dict):
        return args
    if isinstance(args, str):  # older lm-eval: "pretrained=base,peft=adapters/v51"
        return dict(kv.split("=", 1) for kv in args.split(",") if "=" in kv)
    return {}


def lm_eval_model_name(data: dict) -> str | None:
    """The model an lm-eval results file measured: the last path part of the PEFT adapter if any,
    else of ``model_name``, else of ``pretrained`` (``adapters/v51`` -> ``v51``); None if none is named."""
    args = _model_args(data.get("config"))
    for candidate in (args.get("peft"), data.get("model_name"), args.get("pretrained")):
        if isinstance(candidate, str) and candidate.strip():
            return Path(candidate.strip().rstrip("/")).name
    return None


def metric_name(task: str, metric: str, filter_name: str) -> str:
    """``TASK/METRIC`` for filter ``none``, ``TASK/METRIC/FILTER`` otherwise."""
    return f"{task}/{metric}" if filter_name == "none" else f"{task}/{metric}/{filter_name}"


def parse_lm_eval_results(path: str | Path, model: str | None = None) -> Parsed:
    """Whole-run entries from an lm-eval ``results_*.json``, with ``*_stderr`` attached and the directions.

    Args:
        path (str | Path): the results file.
        model (str | None): the model's name; by default read from the file (``lm_eval_model_name``).
    """
    path = Path(path)
    data = _load_json(path)
    problems = _Problems(path)
    results = data.get("results") if isinstance(data, dict) else None
    if not isinstance(results, dict) or not results:
        raise EvidenceError(f"{path}: no 'results' mapping: not an lm-eval results file; nothing was recorded")
    model = model or lm_eval_model_name(data)
    if not model:
        raise EvidenceError(f"{path}: the file names no model (model_name, config.model_args); "
                            "give the model name; nothing was recorded")
    source = f"lm-eval:{path}"
    entries = []
    for task, scores in results.items():
        where = f"results.{task}"
        if not isinstance(scores, dict):
            problems.add(where, None, "expected a mapping of metric,filter -> value")
            continue
        values, errors = {}, {}
        for key, raw in scores.items():
            if key in _RESULT_SKIP or "," not in key:
                continue
            metric, filter_name = key.split(",", 1)
            if metric.endswith("_stderr"):
                if raw not in ("N/A", None):
                    errors[(metric[:-7], filter_name)] = (key, raw)
                continue
            values[(metric, filter_name)] = (key, raw)
        for (metric, filter_name), (key, raw) in values.items():
            value = _number(raw, problems, where, key)
            stderr = None
            if (metric, filter_name) in errors:
                skey, sraw = errors[(metric, filter_name)]
                stderr = _number(sraw, problems, where, skey)
            if value is not None:
                entries.append(Entry(model, metric_name(task, metric, filter_name), value, stderr=stderr,
                                     source=source))
    directions = {}
    hib = data.get("higher_is_better", {})
    for task, by_metric in (hib.items() if isinstance(hib, dict) else []):
        for metric, higher in (by_metric.items() if isinstance(by_metric, dict) else []):
            if isinstance(higher, bool):
                for e in entries:
                    if e.metric == f"{task}/{metric}" or e.metric.startswith(f"{task}/{metric}/"):
                        directions[e.metric] = higher
    problems.raise_if_any()
    if not entries:
        raise EvidenceError(f"{path}: no 'METRIC,FILTER' scores under results; nothing was recorded")
    return Parsed(entries, directions, [str(path)])


def _lookup(doc, dotted: str):
    for part in dotted.split("."):
        if not isinstance(doc, dict) or part not in doc:
            return None
        doc = doc[part]
    return doc


def parse_lm_eval_samples(path: str | Path, model: str | None, *, task: str | None = None,
                          cluster_field: str | None = None, metrics: Iterable[str] | None = None) -> Parsed:
    """Item-level entries from an lm-eval ``--log_samples`` JSONL file (one line per document).

    Args:
        path (str | Path): the samples file, ``samples_TASK_TIMESTAMP.jsonl`` (the task is read from the name).
        model (str | None): the model's name (a samples file does not name it): required.
        task (str | None): the task, when the file name does not follow lm-eval's pattern.
        cluster_field (str | None): a dotted key into each line's ``doc`` (e.g. ``topic``) giving the cluster.
        metrics (Iterable[str] | None): only these metric names (as in the line's ``metrics`` list).
    """
    path = Path(path)
    if not model:
        raise EvidenceError(f"{path}: a samples file does not name its model; give the model name "
                            "(or import it with its results file); nothing was recorded")
    if task is None:
        m = _SAMPLES_NAME.search(path.name)
        if not m:
            raise EvidenceError(f"{path}: cannot read the task from the file name (samples_TASK_*.jsonl); "
                                "give the task; nothing was recorded")
        task = m["task"]
    wanted = None if metrics is None else set(metrics)
    problems = _Problems(path)
    source = f"lm-eval:{path}"
    entries = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise EvidenceError(f"{path}: cannot read the file ({err}); nothing was recorded") from err
    for n, line in enumerate(lines, start=1):
        where = f"line {n}"
        if not line.strip():
            continue
        try:
            sample = json.loads(line)
        except json.JSONDecodeError as err:
            problems.add(where, None, f"not valid JSON ({err.msg})")
            continue
        if not isinstance(sample, dict):
            problems.add(where, None, "expected a JSON object")
            continue
        doc_id = sample.get("doc_id")
        if isinstance(doc_id, bool) or not isinstance(doc_id, (int, str)) or str(doc_id).strip() == "":
            problems.add(where, "doc_id", f"{doc_id!r} is not a document id")
            continue
        names = sample.get("metrics")
        if not isinstance(names, list) or not all(isinstance(x, str) for x in names):
            problems.add(where, "metrics", f"{names!r} is not a list of metric names")
            continue
        filter_name = sample.get("filter", "none")
        if not isinstance(filter_name, str) or not filter_name:
            problems.add(where, "filter", f"{filter_name!r} is not a filter name")
            continue
        cluster = None
        if cluster_field:
            raw = _lookup(sample.get("doc"), cluster_field)
            if raw is None or isinstance(raw, (dict, list)) or str(raw).strip() == "":
                problems.add(where, f"doc.{cluster_field}", f"{raw!r}: no cluster key")
                continue
            cluster = str(raw).strip()
        for name in names:
            if wanted is not None and name not in wanted:
                continue
            if name not in sample:
                problems.add(where, name, "listed in 'metrics' but absent")
                continue
            value = _number(sample[name], problems, where, name, allow_bool=True)
            if value is not None:
                entries.append(Entry(model, metric_name(task, name, filter_name), value, item=str(doc_id),
                                     cluster=cluster, source=source))
    problems.raise_if_any()
    if not entries:
        raise EvidenceError(f"{path}: no item-level scores found; nothing was recorded")
    return Parsed(entries, {}, [str(path)])


def detect_kind(path: str | Path) -> str:
    """``csv``, ``results`` or ``samples`` from the file name (``.csv``, ``.json``, ``.jsonl``)."""
    suffix = Path(path).suffix.lower()
    kinds = {".csv": "csv", ".json": "results", ".jsonl": "samples"}
    if suffix not in kinds:
        raise EvidenceError(f"{path}: unknown kind of file; use .csv, an lm-eval results .json or a "
                            "samples .jsonl")
    return kinds[suffix]


def parse_files(paths: Iterable[str | Path], *, model: str | None = None, cluster_field: str | None = None,
                task: str | None = None) -> Parsed:
    """Parse every file (kind from its suffix) before anything is written; samples files without a
    ``model`` take the model of the results files given with them when those name exactly one."""
    paths = [Path(p) for p in paths]
    if not paths:
        raise EvidenceError("no file to import")
    out = Parsed()
    kinds = {p: detect_kind(p) for p in paths}
    for p in paths:
        if kinds[p] == "results":
            part = parse_lm_eval_results(p, model)
        elif kinds[p] == "csv":
            part = parse_csv(p)
        else:
            continue
        out.entries += part.entries
        out.directions.update(part.directions)
    result_models = {e.model for e in out.entries if e.source.startswith("lm-eval:")}
    sample_model = model or (next(iter(result_models)) if len(result_models) == 1 else None)
    for p in paths:
        if kinds[p] == "samples":
            out.entries += parse_lm_eval_samples(p, sample_model, task=task, cluster_field=cluster_field).entries
    out.files = [str(p) for p in paths]
    return out


def import_files(ledger: Ledger, paths: Iterable[str | Path], *,
                 sha_of: Mapping[str, str | None] | Callable[[str], str | None] | None = None,
                 model: str | None = None, cluster_field: str | None = None, task: str | None = None) -> dict:
    """Parse all ``paths``, fill each entry's sha256 from ``sha_of`` (where the file carried none) and
    write everything in one transaction.

    Args:
        ledger (Ledger): where to record.
        paths: the files (.csv, lm-eval results .json, samples .jsonl).
        sha_of: model name -> its current content sha256 (a mapping or a function); None leaves them unhashed.
        model, cluster_field, task: see ``parse_files``.

    Returns:
        dict: ``{"files": [...], "records": int, "ids": [first, last], "models": [...], "metrics": [...],
        "item_level": int, "directions": {metric: higher_is_better}}``.
    """
    parsed = parse_files(paths, model=model, cluster_field=cluster_field, task=task)
    look = sha_of.get if isinstance(sha_of, Mapping) else (sha_of or (lambda name: None))
    entries = [e if e.sha256 is not None else replace(e, sha256=look(e.model)) for e in parsed.entries]
    ids = ledger.write(entries, parsed.directions)
    return {"files": parsed.files, "records": len(ids), "ids": [ids[0], ids[-1]] if ids else [],
            "models": sorted({e.model for e in entries}), "metrics": sorted({e.metric for e in entries}),
            "item_level": sum(e.item is not None for e in entries), "directions": parsed.directions}


def export_csv_text(rows: Iterable[dict]) -> str:
    """CSV text of ``Ledger.export()`` rows, readable again by ``parse_csv`` (sub-scores as ``sub.KEY``)."""
    rows = list(rows)
    subs = sorted({k for r in rows for k in r if k.startswith("sub.")})
    columns = ["model", "metric", "value", "stderr", "item", "cluster", "note", "sha256", "source", "created",
               "stale", "id", *subs]
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(columns)
    for r in rows:
        writer.writerow(["" if r.get(c) is None else repr(r[c]) if isinstance(r.get(c), float) else r[c]
                         for c in columns])
    return buf.getvalue()
