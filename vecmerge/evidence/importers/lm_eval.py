"""lm-evaluation-harness output: ``results_*.json`` (whole runs) and ``--log_samples`` JSONL (item-level).

results: per task ``"METRIC,FILTER": value`` and ``"METRIC_stderr,FILTER"``, ``higher_is_better`` for the
directions, the model from ``config.model_args`` / ``model_name`` (``lm_eval_model``), each task's environment
(``lm_eval_environment``); a group (``group_subtasks``) is a run of its own with its tasks as sub-scores.
samples: ``samples_TASK_*.jsonl``, one line per document (``doc_id``, ``filter``, ``metrics``, the values).
Metric names: ``TASK/METRIC`` for filter ``none``, ``TASK/METRIC/FILTER`` otherwise, the same in both files,
so a run's value is the mean of its item-level values. The layouts in full: docs/design/evidence.md.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from ...io.hashing import sha256_file
from ...io.parse import ParseError, Written, load_json, parse_json, read_text
from .. import EvidenceError
from ..ledger.environment import canonical_fields
from ..ledger.precision import decimals_of, note
from ..ledger.records import Entry
from .lm_eval_groups import with_group_environments
from .parsing import Parsed, Problems, parse_number

SAMPLES_MAX_BYTES = 1 << 30  # a --log_samples file holds every document: larger than any results file
_RESULT_SKIP = ("alias", "name", "sample_len", "samples")
_SAMPLES_NAME = re.compile(r"samples_(?P<task>.+?)(?:_\d{4}-\d{2}-\d{2}T[\d.:\-]+)?\.jsonl$")


def _problem(err: ParseError) -> str:
    """What the bounded parser found, without its advice (the importer's is: nothing was recorded)."""
    return err.problem.split("; ")[0]


def source_of(path: Path) -> str:
    """``lm-eval:PATH@SHA256``: the file and its content's sha256 (the same file imported twice is recognised)."""
    try:
        return f"lm-eval:{path}@{sha256_file(path)}"
    except OSError as err:
        raise EvidenceError(f"{path}: cannot read the file ({err.strerror or err}); nothing was recorded") from None


def _load_json(path: Path) -> Any:  # parsed JSON: any type until checked
    """A results file, read through ``io.parse`` (bounded, strict: a stranger wrote it)."""
    try:
        return load_json(path, keep_text=True)
    except ParseError as err:
        where = f"{path}: line {err.line}" if err.line else str(path)
        raise EvidenceError(f"{where}: {_problem(err)}; nothing was recorded") from None


def _model_args(config: object) -> dict:
    args = config.get("model_args") if isinstance(config, dict) else None
    if isinstance(args, dict):
        return args
    if isinstance(args, str):  # older lm-eval: "pretrained=base,peft=adapters/v51"
        return dict(kv.split("=", 1) for kv in args.split(",") if "=" in kv)
    return {}


def _written_model(data: dict) -> str | None:
    """The model as the results file names it: the PEFT adapter's path, else ``model_name``, else ``pretrained``."""
    args = _model_args(data.get("config"))
    for candidate in (args.get("peft"), data.get("model_name"), args.get("pretrained")):
        if isinstance(candidate, str) and candidate.strip():
            return candidate.strip()
    return None


def lm_eval_model(data: dict, path: str | Path, adapters: Mapping[str, Path] | None = None,
                  home: Path | None = None) -> str | None:
    """The model an lm-eval results file measured, matched to a workspace adapter by its path.

    The path the file names (``peft=``, else ``model_name``, else ``pretrained``) is resolved relative to the
    results file's folder and to the workspace's folder ``home`` (an absolute path as it is); a workspace
    adapter whose folder is that path gives its name. No match: the path as written (``runs/v60/epoch3``,
    never its last part alone, so two adapters called ``epoch3`` are never pooled). None when the file names
    no model.

    Args:
        data (dict): the results file's JSON. path: the results file.
        adapters (Mapping[str, Path] | None): workspace name -> its folder. home (Path | None): the workspace's folder.

    Raises:
        EvidenceError: the path is two different workspace adapters from the two folders (names the candidates).
    """
    written = _written_model(data)
    if written is None:
        return None
    given = Path(written)
    bases = {"the results file": Path(path).resolve().parent, **({"the workspace": Path(home)} if home else {})}
    folders = {Path(f).resolve(): n for n, f in (adapters or {}).items()}
    matches: dict[str, list[str]] = {}
    for where, base in bases.items():
        name = folders.get((given if given.is_absolute() else base / given).resolve())
        if name is not None:
            matches.setdefault(name, []).append(where)
    if len(matches) > 1:
        told = "; ".join(f"{n} relative to {' and '.join(w)}" for n, w in matches.items())
        raise EvidenceError(f"{path}: the model path {written!r} is ambiguous: {told}; name the model with --model; "
                            "nothing was recorded")
    if matches:
        return next(iter(matches))
    return given.as_posix().rstrip("/") or written


def lm_eval_environment(data: dict, task: str, problems: Problems | None = None) -> tuple[tuple[str, str], ...]:
    """The eval environment of one task of a results file, in ``environment.py``'s canonical form.

    harness ``lm-eval``; harness_version (``lm_eval_version``), transformers_version, git_hash; the task's
    task_version (``versions``), n_shot (``n-shot``), task_hash (``task_hashes``: the documents); the run's
    seed and fewshot_seed (``config.random_seed``, ``config.fewshot_seed``), limit, dtype (``model_args``),
    max_length, chat_template_sha, system_instruction_sha, fewshot_as_multiturn; the generation settings
    (the task's ``generation_kwargs`` overridden by the run's ``config.gen_kwargs``): until -> stop,
    max_gen_toks -> max_tokens, temperature, do_sample, top_p, top_k, any other as ``gen.KEY``. The batch
    size and bootstrap_iters are not part of it (they change no score, or only its stderr). Fields the file
    leaves null are not recorded.
    """
    config: dict = _mapping(data.get("config"))
    args = _model_args(config)

    def of(key: str) -> object:
        table = data.get(key)
        return table.get(task) if isinstance(table, dict) else None

    task_config = _mapping(_mapping(data.get("configs")).get(task))
    generation = {**_kwargs(task_config.get("generation_kwargs")), **_kwargs(config.get("gen_kwargs"))}
    fields = {"harness": "lm-eval", "harness_version": data.get("lm_eval_version"),
              "transformers_version": data.get("transformers_version"), "git_hash": data.get("git_hash"),
              "task_version": of("versions"), "n_shot": of("n-shot"), "task_hash": of("task_hashes"),
              "seed": config.get("random_seed"), "fewshot_seed": config.get("fewshot_seed"),
              "limit": config.get("limit"), "dtype": args.get("dtype"), "max_length": data.get("max_length"),
              "chat_template_sha": data.get("chat_template_sha"),
              "system_instruction_sha": data.get("system_instruction_sha"),
              "fewshot_as_multiturn": data.get("fewshot_as_multiturn")}
    for key, value in generation.items():
        fields[_GENERATION.get(key, f"gen.{key}")] = value
    try:
        return canonical_fields(fields, f"results environment of {task}")
    except EvidenceError as err:
        if problems is None:
            raise
        problems.add(f"environment of {task}", None, str(err))
        return ()


_GENERATION = {"until": "stop", "max_gen_toks": "max_tokens", "temperature": "temperature", "do_sample": "do_sample",
               "top_p": "top_p", "top_k": "top_k"}


def _mapping(value: object) -> dict:
    """``value`` when it is a JSON object, else an empty one."""
    return value if isinstance(value, dict) else {}


def _kwargs(value: object) -> dict:
    """Generation keyword arguments as lm-eval records them: a mapping, or ``"temperature=0,top_p=1"``."""
    if isinstance(value, dict):
        return dict(value)
    if isinstance(value, str):
        return dict(kv.split("=", 1) for kv in value.split(",") if "=" in kv)
    return {}


def metric_name(task: str, metric: str, filter_name: str) -> str:
    """``TASK/METRIC`` for filter ``none``, ``TASK/METRIC/FILTER`` otherwise."""
    return f"{task}/{metric}" if filter_name == "none" else f"{task}/{metric}/{filter_name}"


def parse_lm_eval_results(path: str | Path, model: str | None = None, *, adapters: Mapping[str, Path] | None = None,
                          home: Path | None = None) -> Parsed:
    """Whole-run entries from an lm-eval ``results_*.json``, with ``*_stderr`` attached, each task's eval
    environment (``lm_eval_environment``) and the directions.

    Args:
        path (str | Path): the results file.
        model (str | None): the model's name; by default read from the file (``lm_eval_model``).
        adapters, home: the workspace's adapters and folder, to match the file's model path (``lm_eval_model``).
    """
    path = Path(path)
    data = _load_json(path)
    problems = Problems(path)
    results = data.get("results") if isinstance(data, dict) else None
    if not isinstance(results, dict) or not results:
        raise EvidenceError(f"{path}: no 'results' mapping: not an lm-eval results file; nothing was recorded")
    model = model or lm_eval_model(data, path, adapters, home)
    if not model:
        raise EvidenceError(f"{path}: the file names no model (model_name, config.model_args); "
                            "give the model name; nothing was recorded")
    source = source_of(path)
    entries: list[Entry] = []
    decimals: dict = {}
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
        env = lm_eval_environment(data, task, problems) if values else ()
        for (metric, filter_name), (key, raw) in values.items():
            value = parse_number(raw, problems, where, key)
            note(decimals, metric_name(task, metric, filter_name), None,
                 decimals_of(raw.text) if isinstance(raw, Written) else decimals_of(str(raw)))
            stderr = None
            if (metric, filter_name) in errors:
                skey, sraw = errors[(metric, filter_name)]
                stderr = parse_number(sraw, problems, where, skey)
            if value is not None:
                entries.append(Entry(model, metric_name(task, metric, filter_name), value, stderr=stderr,
                                     source=source, env=env))
    directions = {}
    hib = data.get("higher_is_better", {})
    for task, by_metric in (hib.items() if isinstance(hib, dict) else []):
        for metric, higher in (by_metric.items() if isinstance(by_metric, dict) else []):
            if not isinstance(higher, bool):  # "yes", 1, null: a direction is true or false, nothing else
                problems.add(f"higher_is_better.{task}", metric, f"{higher!r} is not a direction; write true or false")
                continue
            for e in entries:
                if e.metric == f"{task}/{metric}" or e.metric.startswith(f"{task}/{metric}/"):
                    directions[e.metric] = higher
    problems.raise_if_any()
    if not entries:
        raise EvidenceError(f"{path}: no 'METRIC,FILTER' scores under results; nothing was recorded")
    groups = data.get("group_subtasks") if isinstance(data.get("group_subtasks"), dict) else {}
    entries = with_group_environments(_group_subscores(entries, groups), groups,
                                      lambda task: lm_eval_environment(data, task, problems))
    for e in entries:  # a group's sub-scores are its tasks' values, written as the tasks' are
        for task, _ in e.subs:
            note(decimals, e.metric, task, decimals.get((f"{task}/{e.metric.partition('/')[2]}", None)))
    problems.raise_if_any()
    return Parsed(entries, directions, [str(path)], groups, decimals)


def _group_subscores(entries: list[Entry], groups: object) -> list[Entry]:
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


def _lookup(doc: object, dotted: str) -> object:
    for part in dotted.split("."):
        if not isinstance(doc, dict) or part not in doc:
            return None
        doc = doc[part]
    return doc


def parse_lm_eval_samples(path: str | Path, model: str | None, *, task: str | None = None,
                          cluster_field: str | None = None, metrics: Iterable[str] | None = None,
                          env: tuple[tuple[str, str], ...] = ()) -> Parsed:
    """Item-level entries from an lm-eval ``--log_samples`` JSONL file (one line per document).

    Args:
        path (str | Path): the samples file, ``samples_TASK_TIMESTAMP.jsonl`` (the task is read from the name).
        model (str | None): the model's name (a samples file does not name it): required.
        task (str | None): the task, when the file name does not follow lm-eval's pattern.
        cluster_field (str | None): a dotted key into each line's ``doc`` (e.g. ``topic``) giving the cluster.
        metrics (Iterable[str] | None): only these metric names (as in the line's ``metrics`` list).
        env: the eval environment of the task (a samples file does not record it: its results file does).
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
    source = source_of(path)
    entries = []
    try:
        lines = read_text(path, max_bytes=SAMPLES_MAX_BYTES).splitlines()
    except ParseError as err:
        raise EvidenceError(f"{path}: {_problem(err)}; nothing was recorded") from None
    for n, line in enumerate(lines, start=1):
        where = f"line {n}"
        if not line.strip():
            continue
        try:
            sample = parse_json(line, path)
        except ParseError as err:
            problems.add(where, None, _problem(err))
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
                                     cluster=cluster, source=source, env=env))
    problems.raise_if_any()
    if not entries:
        raise EvidenceError(f"{path}: no item-level scores found; nothing was recorded")
    return Parsed(entries, {}, [str(path)])
