"""The evidence commands, ``ls`` and ``gate`` once their flags are parsed: the ledger's operations, then the report."""

from __future__ import annotations

from pathlib import Path

from ..errors import CheckFailed, UsageError, VecmergeError
from ..evidence.ledger.environment import EnvChoice
from ..evidence.ledger.ledger import Ledger
from ..io.parse import ParseError, load_json
from ..io.safe_text import printable
from ..outputs.transaction import PNG, OutputPolicy, write_file
from ..peft.format import CONFIG_NAME
from ..pipeline.gate_check import check_gate
from ..recipe.recipe import Consensus, Recipe
from ..report import evidence as report_evidence
from ..report import rank as report_rank
from ..report.format import to_json
from ..workspace.base_model import declared_base
from ..workspace.names import Workspace
from . import operations as evidence
from .progress import progress_bar


def _ledger(ws: Workspace) -> Ledger:
    return Ledger(ws.ledger_path)


def _say(echo, out, render, as_json: bool) -> None:
    """``--json``: the dict (JSON escapes every control character); else the report, with escape sequences and
    control characters a stranger's names or notes may hold removed (``io.safe_text.printable``)."""
    echo(to_json(out) if as_json else printable(render(out), keep_newlines=True))


def env_fields(options) -> dict[str, str]:
    """``--env KEY=VALUE`` options (repeatable) -> fields; UsageError for one without ``=`` or a value."""
    out = {}
    for option in options or ():
        key, sep, value = option.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise UsageError(f"--env {option!r}: give KEY=VALUE, e.g. --env temperature=0 (repeatable)")
        if key.strip() in out:
            raise UsageError(f"--env {key.strip()} given twice; keep one")
        out[key.strip()] = value
    return out


def _show_path(path) -> str:
    """A path relative to the current folder when it lies below it, else absolute."""
    p = Path(path)
    try:
        return str(p.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(p)


def evidence_add(ws: Workspace, name: str, values: list[float], *, metric: str | None = None, subs=None,
                 note: str | None = None, higher_is_better: bool | None = None, env=(), external: bool = False,
                 decimals: int | None = None, as_json: bool = False, echo=print) -> dict:
    """``vecmerge evidence add NAME VALUE... --metric M``: record runs, tied to NAME's current content sha256.

    Args:
        ws (Workspace): the ledger's place and NAME's adapter. name (str): a workspace name or folder (else
        recorded without a hash). values (list[float]): one per run. metric (str | None): default the
        workspace's ``metric:``. subs (dict[str, float] | None): sub-scores of a single run.
        higher_is_better (bool | None): declare the metric's direction once. env: ``--env KEY=VALUE`` options.
        external (bool): record NAME even when it is close to a workspace name (``--external``).
        decimals (int | None): ``--decimals``: the decimals the values are written with (default: their text).
    """
    metric = metric or ws.metric
    if metric is None:
        raise UsageError("evidence add: name the metric with --metric M (or set metric: in vecmerge.yaml)")
    out = evidence.add(_ledger(ws), name, values, metric=metric, sha256=ws.content_sha(name), subs=subs, note=note,
                       higher_is_better=higher_is_better, env=env_fields(env), workspace_names=ws.adapters,
                       external=external, decimals=decimals)
    _say(echo, out, report_evidence.render_add, as_json)
    return out


def evidence_import(ws: Workspace, paths: list[str], *, model: str | None = None, cluster_field: str | None = None,
                    task: str | None = None, directions: dict | None = None, env=(), decimals: int | None = None,
                    as_json: bool = False, echo=print) -> dict:
    """``vecmerge evidence import FILE...``: CSV, lm-eval results JSON, --log_samples JSONL; all or nothing.

    Each record is tied to its model's current content sha256 (names that are no adapter here: none); lm-eval's
    model paths are matched to the workspace's adapters (relative to the results file and to the workspace).

    Args:
        directions (dict[str, bool] | None): metric -> higher_is_better, declared in the same transaction.
        env: ``--env KEY=VALUE`` options: fields added to every record's eval environment.
    """
    out = evidence.import_(_ledger(ws), paths, current_sha=ws.content_sha, model=model, cluster_field=cluster_field,
                           task=task, directions=directions, adapters=ws.adapters, home=ws.home, env=env_fields(env),
                           decimals=decimals)
    out["unhashed"] = [m for m in out["models"] if ws.content_sha(m) is None]
    _say(echo, out, report_evidence.render_import, as_json)
    return out


def evidence_export(ws: Workspace, fmt: str = "csv", *, echo=print) -> str:
    """``vecmerge evidence export --format csv|json``: every record, stale ones flagged, to stdout."""
    ledger = _ledger(ws)
    text = evidence.export(ledger, fmt, current_sha=ws.current_shas(ledger.models()))
    echo(text.rstrip("\n"))
    return text


def evidence_show(ws: Workspace, names=(), metric: str | None = None, *, include_stale: bool = False, plot=None,
                  force: bool = False, env=(), by: str | None = None, as_json: bool = False, echo=print) -> dict:
    """``vecmerge evidence show [NAME...] [--metric M] [--stale] [--env ID|K=V] [--by env] [--plot F.png [--force]]``:
    summaries of current runs, per eval environment, and the variance components of each replicate group.

    Args:
        plot (str | Path | None): a PNG of means with their t intervals, written atomically, never over the
            ledger, the workspace file, an adapter folder or the base model, nor over an existing file
            unless ``force`` and it is a PNG.
    """
    ledger = _ledger(ws)
    policy = None
    if plot:  # refused before any work
        policy = OutputPolicy.for_command(inputs=[ledger.path, *([ws.file] if ws.file else [])],
                                          workspace_adapters=ws.adapters, base_model=ws.base_model, force=force)
        policy.check_file(plot, PNG, flag="--plot")
    out = evidence.show(ledger, list(names) or None, metric, current_sha=ws.current_shas(ledger.models()),
                        include_stale=include_stale, env=EnvChoice.parse(env), by=by,
                        replicates=ws.replicate_groups())
    if plot:
        write_file(plot, lambda f: report_evidence.plot_show(out, f), policy=policy, kind=PNG, flag="--plot")
    _say(echo, out, report_evidence.render_show, as_json)
    if plot:
        echo(f"plot: {plot}", err=as_json)
    return out


def evidence_compare(ws: Workspace, a: str, b: str, metric: str | None = None, *, detect: float | None = None,
                     include_stale: bool = False, as_json: bool = False, echo=print, target: str | None = None,
                     margin: float | None = None, env=()) -> dict:
    """``vecmerge evidence compare A B [--metric M] [--detect D] [--target K] [--margin M]``: Welch, paired and
    clustered tests, the verdict, and every sub-score with what the difference costs the others.

    The metric defaults to the workspace's ``metric:`` when A and B both have records of it. One eval environment
    (``--env ID`` or ``--env KEY=VALUE`` picks it when the records span several); replicate groups reported.
    """
    ledger = _ledger(ws)
    current = ws.current_shas(ledger.models())
    if metric is None and ws.metric is not None:
        shared = [{r.metric for r in ledger.records([n], current_sha=current)} for n in (a, b)]
        metric = ws.metric if all(ws.metric in m for m in shared) else None
    out = evidence.compare_models(ledger, a, b, metric, current_sha=current, include_stale=include_stale,
                                  detect=detect, target=target, margin=margin, env=EnvChoice.parse(env),
                                  replicates=ws.replicate_groups())
    _say(echo, out, report_evidence.render_compare, as_json)
    return out


def evidence_calibrate(ws: Workspace, proxy, target: str, *, min_models: int | None = None, loo: bool = False,
                       env=(), as_json: bool = False, echo=print) -> dict:
    """``vecmerge evidence calibrate --proxy P[,P2...] --target T [--loo] [--env ID|K=V ...]``: can P rank the models
    the way T does? Each metric in one eval environment.

    Args:
        proxy (str | list[str]): one metric, or several (``loo`` only: combined by least squares).
        loo (bool): judge held-out predictions, each model left out of its own fit (``evidence.loo``).
    """
    ledger = _ledger(ws)
    proxies = [proxy] if isinstance(proxy, str) else list(proxy)
    options = {} if min_models is None else {"min_models": min_models}
    current = ws.current_shas(ledger.models())
    if loo:
        out = evidence.calibrate_loo_metrics(ledger, proxies, target, current_sha=current, env=EnvChoice.parse(env),
                                             **options)
        _say(echo, out, report_rank.render_calibrate_loo, as_json)
        return out
    if len(proxies) != 1:
        raise UsageError(f"--proxy {','.join(proxies)}: several proxies are combined by a least-squares fit, which "
                         "only a held-out calibration can judge; add --loo")
    out = evidence.calibrate_metrics(ledger, proxies[0], target, current_sha=current, env=EnvChoice.parse(env),
                                     **options)
    _say(echo, out, report_evidence.render_calibrate, as_json)
    return out


def evidence_plan(ws: Workspace, a: str, b: str, *, metric: str | None, min_effect: float, max_runs: int,
                  alpha: float = 0.05, as_json: bool = False, echo=print) -> dict:
    """``vecmerge evidence plan A --vs B --metric M --min-effect D --max-runs N [--alpha A]``: record a plan, tied to
    A's and B's content sha256 now (names that are no adapter here: none)."""
    metric = metric or ws.metric
    if metric is None:
        raise UsageError("evidence plan: name the metric with --metric M (or set metric: in vecmerge.yaml)")
    ledger = _ledger(ws)
    out = evidence.plan(ledger, a, b, metric=metric, min_effect=min_effect, max_runs=max_runs, alpha=alpha,
                        current_sha={**ws.current_shas(ledger.models()), a: ws.content_sha(a), b: ws.content_sha(b)})
    _say(echo, out, report_evidence.render_plan, as_json)
    return out


def evidence_decide(ws: Workspace, a: str, b: str, *, metric: str | None = None, replay: bool = False, env=(),
                    as_json: bool = False, echo=print) -> dict:
    """``vecmerge evidence decide A --vs B [--metric M] [--replay] [--env ID|K=V]``: the latest plan's sequential
    decision over its looks (one eval environment)."""
    ledger = _ledger(ws)
    out = evidence.decide(ledger, a, b, metric, current_sha=ws.current_shas([a, b]), replay=replay,
                          env=EnvChoice.parse(env))
    _say(echo, out, report_evidence.render_decide, as_json)
    return out


def _base_model_of(folder: Path, roots=()) -> str | None:
    try:  # a stranger's file: bounded and strict
        config = load_json(folder / CONFIG_NAME)
    except ParseError:
        return None
    return declared_base(config.get("base_model_name_or_path"), roots) if isinstance(config, dict) else None


def gate_dict(check) -> dict:
    """``GateCheck.to_dict`` with the ledger shown relative to the current folder (the manifest keeps it whole)."""
    return {**check.to_dict(), "ledger": _show_path(check.ledger)}


def ls(ws: Workspace, *, metric: str | None = None, as_json: bool = False, echo=print) -> list[dict]:
    """``vecmerge ls``: every workspace entry with its sha256, base model, parent, runs and mean of the metric.

    The metric: ``--metric``, else the workspace's ``metric:``, else the ledger's only one. An entry whose
    files cannot be read is listed with the reason instead of a hash.
    """
    ledger = _ledger(ws)
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
        entries[name] = {"path": _show_path(folder), "sha256": sha, "base_model": _base_model_of(folder, (ws.home,)),
                         "parent": parents.get(name)}
    rows = evidence.ls_rows(entries, ledger if ledger.path.exists() else None, metric=metric)
    for r in rows:
        r["root"] = r["name"] in roots
        r["problem"], r["error"] = problems.get(r["name"], (None, None))
    out = {"workspace": str(ws.file) if ws.file else None, "ledger": _show_path(ledger.path), "metric": metric,
           "adapters": rows}
    _say(echo, out, lambda o: report_evidence.render_ls(o["adapters"], metric), as_json)
    return out


def gate(ws: Workspace, base: str, direction: str, *, consensus_ref: str | None = None, trust: float | None = None,
         metric: str | None = None, env=(), as_json: bool = False, echo=print, progress=None) -> dict:
    """``vecmerge gate --base B --dir X-Y [--consensus-ref R] [--trust T] [--metric M] [--env ID|K=V]``: the seven
    conditions (``--env``: the eval environment of the evidence rows, over ``gate: env:``).

    The same facts ``project --gate`` judges (``pipeline.gate.check_gate``); the consensus is counted, never
    enforced here (``on_disagree: keep``). Raises CheckFailed (exit 1) unless every condition passes.
    """
    recipe = Recipe(base=base, dir=direction, trust=trust, method="add",
                    consensus=Consensus(consensus_ref, "keep") if consensus_ref else None,
                    gate={**({"metric": metric} if metric else {}), **({"env": list(env)} if env else {})} or True)
    check = check_gate(recipe, ws, progress_bar(progress, "gate"))
    out = gate_dict(check)
    _say(echo, out, report_evidence.render_gate, as_json)
    if not check.passed:
        bad = [f"{r['condition']} {r['status']}" for r in out["rows"] if r["status"] != "PASS"]
        raise CheckFailed(f"gate: {len(bad)} of {len(out['rows'])} conditions did not pass ({', '.join(bad)})")
    return out
