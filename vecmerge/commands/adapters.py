"""``inspect`` and ``audit`` once their flags are parsed: describe adapters, measure agreement, render."""

from __future__ import annotations

from pathlib import Path

from ..analysis.audit import AuditReport, PairwiseReport, audit_pairwise, audit_trajectories
from ..analysis.inspect import AdapterSummary, describe
from ..expr import parse
from ..outputs.transaction import PNG, OutputPolicy, write_file
from ..report import audit as report_audit
from ..report.format import to_json
from ..report.inspect import render_inspect
from ..requests import Audit, Inspect
from ..workspace.names import Workspace
from .printing import Echo
from .progress import progress_bar


def inspect(ws: Workspace, req: Inspect, *, echo: Echo = print, progress=None) -> list[AdapterSummary]:
    """``vecmerge inspect ADAPTER...``: config, scale rule, ranks, dtype, norms and sha256 of each.

    ``--base-model``: a local base model folder, needed for DoRA adapters (their effective update depends on its
    weights); default the workspace's ``base_model``.

    Args:
        ws (Workspace): resolves names. req (Inspect): the command's inputs.
        echo (callable): where text goes. progress (callable | None): ``progress(desc)`` -> iterable wrapper.
    """
    from ..errors import AdapterError

    base = req.base_model or ws.base_model
    wsi = ws.with_biases().with_dora_base(base) if base else ws.with_biases()  # inspect drops nothing
    infos = []
    for a in req.adapters:
        adapter = wsi.adapter(a, "drop")  # shows any modules_to_save
        updates = None
        if adapter.config.use_dora:
            if not base:
                raise AdapterError(f"{adapter.path}: a DoRA adapter: its update m * (W + sBA) / ||W + sBA|| - W "
                                   "depends on the base model's weights; pass --base-model FOLDER (the model it was "
                                   "trained on)")
            from ..workspace.dora import dora_modules

            updates = dora_modules(adapter, Path(base))
        infos.append(describe(adapter, progress_bar(progress, f"inspect {a}"), updates=updates,
                              dora_base=str(base) if updates is not None else None))
    echo(to_json(infos if len(infos) > 1 else infos[0]) if req.as_json else render_inspect(infos))
    return infos


def audit(ws: Workspace, req: Audit, *, echo: Echo = print, progress=None) -> AuditReport | PairwiseReport:
    """``vecmerge audit``: ``--ref``/``--dir`` agreement, or the pairwise matrix of ADAPTERS, in the view asked.

    ``--plot``: a heatmap PNG, never over an input, nor over an existing file unless ``--force`` and it is a PNG;
    ``--samples``: chance-band draws; ``--by``, ``--sort``, ``--format``: the view (``report_audit.render``).
    """
    bar = progress_bar(progress, "audit")
    trajectories = (req.ref, req.direction) if req.ref is not None and req.direction is not None else None
    policy = None
    if req.plot:  # refuse a --plot over an input (or any file not a PNG) before the work
        exprs = list(trajectories) if trajectories is not None else list(req.adapters)
        names = dict.fromkeys(n for e in exprs for n in parse(e).names())
        policy = OutputPolicy.for_command(inputs={n: ws.path_of(n) for n in names}, workspace_adapters=ws.adapters,
                                          base_model=ws.base_model, force=req.force)
        policy.check_file(req.plot, PNG, flag="--plot")
    result: AuditReport | PairwiseReport
    if trajectories is not None:  # the request holds --ref and --dir together, or ADAPTERS
        result = audit_trajectories(ws, *trajectories, req.allow_missing, req.samples, bar,
                                    modules_to_save=req.modules_to_save, allow_base_mismatch=req.allow_base_mismatch)
    else:
        result = audit_pairwise(ws, list(req.adapters), req.allow_missing, bar, modules_to_save=req.modules_to_save,
                                allow_base_mismatch=req.allow_base_mismatch)
    fmt = req.format
    echo(report_audit.render(result, by=req.by, sort=req.sort, fmt=fmt))
    if req.plot and policy is not None:
        write_file(req.plot, lambda f: report_audit.plot(result, f), policy=policy, kind=PNG, flag="--plot")
        echo(f"heatmap: {req.plot}", err=fmt != "table")
    return result
