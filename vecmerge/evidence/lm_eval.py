"""lm-evaluation-harness output: ``results_*.json`` (whole runs) and ``--log_samples`` JSONL (item-level).

    results    per task, ``"METRIC,FILTER": value`` and ``"METRIC_stderr,FILTER": value or "N/A"``;
               ``higher_is_better`` gives the directions; the model from ``config.model_args`` / ``model_name``.
               A group (``group_subtasks``: group -> its tasks, nested groups included) is a run of its own,
               ``GROUP/METRIC[/FILTER]``, whose sub-scores are its tasks' values of the same metric and
               filter, keyed by task name; each task stays a metric of its own as well.
    samples    ``samples_TASK_*.jsonl``: one line per document with ``doc_id``, ``filter``, ``metrics``
               (names) and one value per metric.

Metric names: ``TASK/METRIC`` for filter ``none``, ``TASK/METRIC/FILTER`` otherwise, the same for the
results file and its samples, so a run's value is the mean of its item-level values. Checked against the
real lm-eval 0.4.13 output in tests/fixtures/lm_eval.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path

from . import EvidenceError
from .parsing import Parsed, Problems, parse_number
from .records import Entry

_RESULT_SKIP = ("alias", "name", "sample_len", "samples")
_SAMPLES_NAME = re.compile(r"samples_(?P<task>.+?)(?:_\d{4}-\d{2}-\d{2}T[\d.:\-]+)?\.jsonl$")


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
    problems = Problems(path)
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
            value = parse_number(raw, problems, where, key)
            stderr = None
            if (metric, filter_name) in errors:
                skey, sraw = errors[(metric, filter_name)]
                stderr = parse_number(sraw, problems, where, skey)
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
    return Parsed(_group_subscores(entries, data.get("group_subtasks")), directions, [str(path)])


def _group_subscores(entries: list[Entry], groups) -> list[Entry]:
    """Each group's run with its tasks' values of the same metric and filter as sub-scores (keyed by task)."""
    if not isinstance(groups, dict):
        return entries
    by_metric = {e.metric: e for e in entries}
    out = []
    for e in entries:
        task, _, rest = e.metric.partition("/")
        tasks = groups.get(task)
        subs = {t: by_metric[f"{t}/{rest}"].value for t in tasks if isinstance(t, str) and f"{t}/{rest}" in by_metric
                } if isinstance(tasks, list) else {}
        out.append(replace(e, subs=tuple(sorted(subs.items()))) if subs else e)
    return out


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
    problems = Problems(path)
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
            value = parse_number(sample[name], problems, where, name, allow_bool=True)
            if value is not None:
                entries.append(Entry(model, metric_name(task, name, filter_name), value, item=str(doc_id),
                                     cluster=cluster, source=source))
    problems.raise_if_any()
    if not entries:
        raise EvidenceError(f"{path}: no item-level scores found; nothing was recorded")
    return Parsed(entries, {}, [str(path)])
