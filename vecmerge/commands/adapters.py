"""``inspect`` and ``audit`` once their flags are parsed: describe adapters, measure agreement, render."""

from __future__ import annotations

from pathlib import Path

from ..analysis.audit import audit_pairwise, audit_trajectories
from ..analysis.inspect import describe
from ..expr import parse
from ..outputs.transaction import PNG, OutputPolicy, write_file
from ..report import audit as report_audit
from ..report.format import to_json
from ..report.inspect import render_inspect
from ..workspace.names import Workspace
from .progress import progress_bar


def inspect(ws: Workspace, adapters: list[str], *, base_model=None, as_json: bool = False, echo=print,
            progress=None) -> list[dict]:
    """``vecmerge inspect ADAPTER...``: config, scale rule, ranks, dtype, norms and sha256 of each.

    Args:
        ws (Workspace): resolves names. adapters (list[str]): names or folders. as_json (bool): JSON output.
        base_model (str | Path | None): a local base model folder, needed for DoRA adapters (their effective update
            depends on its weights); default the workspace's ``base_model``.
        echo (callable): where text goes. progress (callable | None): ``progress(desc)`` -> iterable wrapper.
    """
    from ..errors import AdapterError

    base = base_model or ws.base_model
    wsi = ws.with_biases().with_dora_base(base) if base else ws.with_biases()  # inspect drops nothing
    infos = []
    for a in adapters:
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
    bar = progress_bar(progress, "audit")
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
