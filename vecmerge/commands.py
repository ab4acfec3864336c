"""What each ``vecmerge`` command does once its flags are parsed: library calls, then rendering.

``cli.py`` turns flags into these calls; ``demo.py`` calls them directly with the arguments of the
commands it prints, so the transcript is exactly what a user typing them would see. Every function
writes through ``echo(text, err=False)`` and raises ``VecmergeError`` subclasses (a failed check:
``CheckFailed``, exit 1).
"""

from __future__ import annotations

import json
from pathlib import Path

from .analysis.audit import audit_pairwise, audit_trajectories
from .analysis.inspect import describe
from .errors import CheckFailed, UsageError, VecmergeError
from .evidence import operations as evidence
from .evidence.ledger import Ledger
from .expr import parse
from .outputs.transaction import PNG, OutputPolicy, write_file
from .pipeline import run
from .pipeline.gate_check import GateFailed, check_gate, declared_base
from .recipe.recipe import Consensus, Recipe
from .report import audit as report_audit
from .report import evidence as report_evidence
from .report import models as report_model
from .report import verify as report_verify
from .report.text import render_inspect, render_merge, render_modules, to_json
from .verify.output import verify_identities, verify_output
from .workspace.names import Workspace


def _bar(progress, desc: str):
    return progress(desc) if progress else None


def inspect(ws: Workspace, adapters: list[str], *, as_json: bool = False, echo=print, progress=None) -> list[dict]:
    """``vecmerge inspect ADAPTER...``: config, scale rule, ranks, dtype, norms and sha256 of each.

    Args:
        ws (Workspace): resolves names. adapters (list[str]): names or folders. as_json (bool): JSON output.
        echo (callable): where text goes. progress (callable | None): ``progress(desc)`` -> iterable wrapper.
    """
    infos = [describe(ws.adapter(a, "drop"), _bar(progress, f"inspect {a}")) for a in adapters]  # shows any
    echo(to_json(infos if len(infos) > 1 else infos[0]) if as_json else render_inspect(infos))
    return infos


def audit(ws: Workspace, *, ref: str | None = None, direction: str | None = None, adapters=(), by: str = "module",
          sort: str = "module", fmt: str = "table", plot=None, allow_missing: bool = False, samples: int = 200,
          modules_to_save: str = "refuse", allow_base_mismatch: bool = False, force: bool = False, echo=print,
          progress=None) -> dict:
    """``vecmerge audit``: ``ref``/``direction`` agreement, or the pairwise matrix of ``adapters``.

    Args:
        ws (Workspace). ref, direction (str | None): expressions (given together). adapters (list[str]):
        two or more expressions (pairwise). by, sort, fmt (str): the view (see ``report_audit.render``).
        plot (str | Path | None): a heatmap PNG to write (never over an input, nor over an existing file
        unless ``force`` and it is a PNG). allow_missing (bool). samples (int): chance-band draws.
        modules_to_save (str): refuse | drop. allow_base_mismatch (bool): audit adapters of different base models.
    """
    bar = _bar(progress, "audit")
    more = {"modules_to_save": modules_to_save, "allow_base_mismatch": allow_base_mismatch}
    policy = None
    if plot:  # refuse a --plot over an input (or any file not a PNG) before the work
        exprs = [ref, direction] if ref is not None else list(adapters)
        names = dict.fromkeys(n for e in exprs for n in parse(e).names())
        policy = OutputPolicy.for_command(inputs={n: ws.path_of(n) for n in names}, workspace_adapters=ws.adapters,
                                          base_model=ws.base_model, force=force)
        policy.check_file(plot, PNG, flag="--plot")
    if ref is not None:
        result = audit_trajectories(ws, ref, direction, allow_missing, samples, bar, **more)
    else:
        result = audit_pairwise(ws, list(adapters), allow_missing, bar, **more)
    echo(report_audit.render(result, by=by, sort=sort, fmt=fmt))
    if plot:
        write_file(plot, lambda f: report_audit.plot(result, f), policy=policy, kind=PNG, flag="--plot")
        echo(f"heatmap: {plot}", err=fmt != "table")
    return result


def merge(ws: Workspace, recipe: Recipe, *, force: bool = False, dry_run: bool = False, as_json: bool = False,
          show_modules: bool = False, echo=print, progress=None):
    """``vecmerge project`` / ``refactor`` / ``merge`` / ``run``: run the recipe and print its report.

    Args:
        ws (Workspace). recipe (Recipe): what to do. force (bool): replace outputs vecmerge wrote.
        dry_run (bool): write nothing. as_json (bool). show_modules (bool): also the per-module table.
    """
    try:
        rep = run(recipe, ws, dry_run=dry_run, force=force, progress=_bar(progress, recipe.kind))
    except GateFailed as e:  # the gate's table, then the error line
        echo(to_json({"gate": _gate_dict(e.check)}) if as_json else report_evidence.render_gate(_gate_dict(e.check)))
        raise
    if rep.gate is not None and not as_json:
        g = rep.gate
        where = "" if dry_run else "; its table is in each output's vecmerge.json and README.md"
        echo(f"gate ({g.backbone} + alpha * ({g.x} - {g.y}), metric {g.metric}): "
             f"{report_evidence.gate_verdict(g.as_dict())}{where} (vecmerge gate shows it)\n")
    echo(to_json(rep.to_dict()) if as_json else render_merge(rep))
    if show_modules and not as_json:
        echo("\n" + render_modules(rep))
    return rep


def verify(ws: Workspace, targets: list[str], *, base_model=None, identities: bool = False, as_json: bool = False,
           allow_base_mismatch: bool = False, echo=print, progress=None) -> dict:
    """``vecmerge verify``: re-derive an output from its manifest (or check identities); CheckFailed if any fails.

    Args:
        ws (Workspace): names for ``identities``; its ``base_model`` is the default ``base_model`` (and its
            ``base_model_id`` the hub id that folder stands for).
        targets (list[str]): one output folder, or adapters (names or folders) with ``identities``.
        base_model (str | Path | None): a local transformers model folder: also load through PEFT.
        allow_base_mismatch (bool): run the PEFT checks on a base model the output does not declare.
    """
    bar = _bar(progress, "verify")
    if identities:
        labels = [t if t in ws.adapters else Path(t).name or t for t in targets]  # workspace names as typed
        result = verify_identities([ws.adapter(t, "drop") for t in targets], progress=bar, labels=labels)
    else:
        aliases = {ws.base_model: ws.base_model_id} if ws.base_model and ws.base_model_id else None
        result = verify_output(targets[0], base_model=base_model or ws.base_model, progress=bar,
                               allow_base_mismatch=allow_base_mismatch, base_model_aliases=aliases)
    echo(to_json(result) if as_json else report_verify.render(result))
    if not result["passed"]:
        failed = [c["name"] for c in result["checks"] if not c["passed"]]
        raise CheckFailed(f"{len(failed)} check(s) failed: {', '.join(failed)}")
    return result


# -- evidence: the ledger, comparisons, calibration, ls and the gate ------------------------------------

def _ledger(ws: Workspace) -> Ledger:
    return Ledger(ws.ledger_path)


def _show_path(path) -> str:
    """A path relative to the current folder when it lies below it, else absolute."""
    p = Path(path)
    try:
        return str(p.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(p)


def evidence_add(ws: Workspace, name: str, values: list[float], *, metric: str | None = None, subs=None,
                 note: str | None = None, higher_is_better: bool | None = None, as_json: bool = False,
                 echo=print) -> dict:
    """``vecmerge evidence add NAME VALUE... --metric M``: record runs, tied to NAME's current content sha256.

    Args:
        ws (Workspace): the ledger's place and NAME's adapter. name (str): a workspace name or folder (else
        recorded without a hash). values (list[float]): one per run. metric (str | None): default the
        workspace's ``metric:``. subs (dict[str, float] | None): sub-scores of a single run.
        higher_is_better (bool | None): declare the metric's direction once.
    """
    metric = metric or ws.metric
    if metric is None:
        raise UsageError("evidence add: name the metric with --metric M (or set metric: in vecmerge.yaml)")
    out = evidence.add(_ledger(ws), name, values, metric=metric, sha256=ws.content_sha(name), subs=subs, note=note,
                       higher_is_better=higher_is_better)
    echo(to_json(out) if as_json else report_evidence.render_add(out))
    return out


def evidence_import(ws: Workspace, paths: list[str], *, model: str | None = None, cluster_field: str | None = None,
                    task: str | None = None, directions: dict | None = None, as_json: bool = False,
                    echo=print) -> dict:
    """``vecmerge evidence import FILE...``: CSV, lm-eval results JSON, --log_samples JSONL; all or nothing.

    Each record is tied to its model's current content sha256 (names that are no adapter here: none).

    Args:
        directions (dict[str, bool] | None): metric -> higher_is_better, declared in the same transaction.
    """
    out = evidence.import_(_ledger(ws), paths, current_sha=ws.content_sha, model=model, cluster_field=cluster_field,
                           task=task, directions=directions)
    out["unhashed"] = [m for m in out["models"] if ws.content_sha(m) is None]
    echo(to_json(out) if as_json else report_evidence.render_import(out))
    return out


def evidence_export(ws: Workspace, fmt: str = "csv", *, echo=print) -> str:
    """``vecmerge evidence export --format csv|json``: every record, stale ones flagged, to stdout."""
    ledger = _ledger(ws)
    text = evidence.export(ledger, fmt, current_sha=ws.current_shas(ledger.models()))
    echo(text.rstrip("\n"))
    return text


def evidence_show(ws: Workspace, names=(), metric: str | None = None, *, include_stale: bool = False, plot=None,
                  force: bool = False, as_json: bool = False, echo=print) -> dict:
    """``vecmerge evidence show [NAME...] [--metric M] [--stale] [--plot F.png [--force]]``: summaries of current runs.

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
                        include_stale=include_stale)
    if plot:
        write_file(plot, lambda f: report_evidence.plot_show(out, f), policy=policy, kind=PNG, flag="--plot")
    echo(to_json(out) if as_json else report_evidence.render_show(out))
    if plot:
        echo(f"plot: {plot}", err=as_json)
    return out


def evidence_compare(ws: Workspace, a: str, b: str, metric: str | None = None, *, detect: float | None = None,
                     include_stale: bool = False, as_json: bool = False, echo=print) -> dict:
    """``vecmerge evidence compare A B [--metric M] [--detect D]``: Welch, paired and clustered tests, the verdict.

    The metric defaults to the workspace's ``metric:`` when A and B both have records of it.
    """
    ledger = _ledger(ws)
    current = ws.current_shas(ledger.models())
    if metric is None and ws.metric is not None:
        shared = [{r.metric for r in ledger.records([n], current_sha=current)} for n in (a, b)]
        metric = ws.metric if all(ws.metric in m for m in shared) else None
    out = evidence.compare_models(ledger, a, b, metric, current_sha=current, include_stale=include_stale,
                                  detect=detect)
    echo(to_json(out) if as_json else report_evidence.render_compare(out))
    return out


def evidence_calibrate(ws: Workspace, proxy: str, target: str, *, min_models: int | None = None,
                       as_json: bool = False, echo=print) -> dict:
    """``vecmerge evidence calibrate --proxy P --target T``: can P rank the models the way T does?"""
    ledger = _ledger(ws)
    options = {} if min_models is None else {"min_models": min_models}
    out = evidence.calibrate_metrics(ledger, proxy, target, current_sha=ws.current_shas(ledger.models()), **options)
    echo(to_json(out) if as_json else report_evidence.render_calibrate(out))
    return out


def _base_model_of(folder: Path) -> str | None:
    try:
        return declared_base(json.loads((folder / "adapter_config.json").read_text()).get("base_model_name_or_path"))
    except (OSError, ValueError, AttributeError, TypeError):
        return None


def _gate_dict(check) -> dict:
    """``GateCheck.as_dict`` with the ledger shown relative to the current folder (the manifest keeps it whole)."""
    return {**check.as_dict(), "ledger": _show_path(check.ledger)}


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
        entries[name] = {"path": _show_path(folder), "sha256": sha, "base_model": _base_model_of(folder),
                         "parent": parents.get(name)}
    rows = evidence.ls_rows(entries, ledger if ledger.path.exists() else None, metric=metric)
    for r in rows:
        r["root"] = r["name"] in roots
        r["problem"], r["error"] = problems.get(r["name"], (None, None))
    out = {"workspace": str(ws.file) if ws.file else None, "ledger": _show_path(ledger.path), "metric": metric,
           "adapters": rows}
    echo(to_json(out) if as_json else report_evidence.render_ls(rows, metric))
    return out


def gate(ws: Workspace, base: str, direction: str, *, consensus_ref: str | None = None, trust: float | None = None,
         metric: str | None = None, as_json: bool = False, echo=print, progress=None) -> dict:
    """``vecmerge gate --base B --dir X-Y [--consensus-ref R] [--trust T] [--metric M]``: the six conditions.

    The same facts ``project --gate`` judges (``pipeline.gate.check_gate``); the consensus is counted, never
    enforced here (``on_disagree: keep``). Raises CheckFailed (exit 1) unless every condition passes.
    """
    recipe = Recipe(base=base, dir=direction, trust=trust, method="add",
                    consensus=Consensus(consensus_ref, "keep") if consensus_ref else None,
                    gate={"metric": metric} if metric else True)
    check = check_gate(recipe, ws, _bar(progress, "gate"))
    out = _gate_dict(check)
    echo(to_json(out) if as_json else report_evidence.render_gate(out))
    if not check.passed:
        bad = [f"{r['condition']} {r['status']}" for r in out["rows"] if r["status"] != "PASS"]
        raise CheckFailed(f"gate: {len(bad)} of {len(out['rows'])} conditions did not pass ({', '.join(bad)})")
    return out


def extract(base_model, tuned, out, *, rank: str, targets=("all-linear",), others=None, dtype: str = "fp32",
            seed: int = 0, force: bool = False, as_json: bool = False, show_modules: bool = False, echo=print,
            progress=None) -> dict:
    """``vecmerge extract``: a LoRA from a full fine-tune (``extract_output.extract``), then its report.

    Args:
        base_model, tuned (str | Path): model folders. out (str | Path). rank (str): N | energy:E | auto.
        targets (Iterable[str]). others (str | None): save | drop. dtype (str). seed (int). force (bool).
        as_json (bool): print the manifest. show_modules (bool): also the per-module table.
    """
    from .models.extract_write import extract as run_extract

    man = run_extract(base_model, tuned, out, rank=rank, targets=targets, others=others, dtype=dtype, seed=seed,
                      force=force, progress=_bar(progress, "extract"))
    echo(to_json(man) if as_json else report_model.render_extract(man, show_modules))
    return man


def fuse(adapter, base_model, out, *, dtype=None, force: bool = False, as_json: bool = False, echo=print,
         progress=None) -> dict:
    """``vecmerge fuse``: ADAPTER added into BASE's weights, written as a plain model; then its report.

    Args:
        adapter (str | Path): a PEFT LoRA folder. base_model (str | Path). out (str | Path).
        dtype (str | None): fp32 | bf16 | fp16, or None (stored dtypes). force (bool). as_json (bool).
    """
    from .models.fuse import fuse as run_fuse

    man = run_fuse(adapter, base_model, out, dtype=dtype, force=force, progress=_bar(progress, "fuse"))
    echo(to_json(man) if as_json else report_model.render_fuse(man))
    return man
