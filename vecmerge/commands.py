"""What each ``vecmerge`` command does once its flags are parsed: library calls, then rendering.

``cli.py`` turns flags into these calls; ``demo.py`` calls them directly with the arguments of the
commands it prints, so the transcript is exactly what a user typing them would see. Every function
writes through ``echo(text, err=False)`` and raises ``VecmergeError`` subclasses (a failed check:
``CheckFailed``, exit 1).
"""

from __future__ import annotations

from . import report_audit, report_model, report_verify
from .audit import audit_pairwise, audit_trajectories
from .describe import describe
from .errors import CheckFailed
from .pipeline import run
from .recipe import Recipe
from .report import render_inspect, render_merge, render_modules, to_json
from .verify import verify_identities, verify_output
from .workspace import Workspace


def _bar(progress, desc: str):
    return progress(desc) if progress else None


def inspect(ws: Workspace, adapters: list[str], *, as_json: bool = False, echo=print, progress=None) -> list[dict]:
    """``vecmerge inspect ADAPTER...``: config, scale rule, ranks, dtype, norms and sha256 of each.

    Args:
        ws (Workspace): resolves names. adapters (list[str]): names or folders. as_json (bool): JSON output.
        echo (callable): where text goes. progress (callable | None): ``progress(desc)`` -> iterable wrapper.
    """
    infos = [describe(ws.adapter(a), _bar(progress, f"inspect {a}")) for a in adapters]
    echo(to_json(infos if len(infos) > 1 else infos[0]) if as_json else render_inspect(infos))
    return infos


def audit(ws: Workspace, *, ref: str | None = None, direction: str | None = None, adapters=(), by: str = "module",
          sort: str = "module", fmt: str = "table", plot=None, allow_missing: bool = False, samples: int = 200,
          echo=print, progress=None) -> dict:
    """``vecmerge audit``: ``ref``/``direction`` agreement, or the pairwise matrix of ``adapters``.

    Args:
        ws (Workspace). ref, direction (str | None): expressions (given together). adapters (list[str]):
        two or more expressions (pairwise). by, sort, fmt (str): the view (see ``report_audit.render``).
        plot (str | Path | None): a heatmap PNG to write. allow_missing (bool). samples (int): chance-band draws.
    """
    bar = _bar(progress, "audit")
    if ref is not None:
        result = audit_trajectories(ws, ref, direction, allow_missing, samples, bar)
    else:
        result = audit_pairwise(ws, list(adapters), allow_missing, bar)
    echo(report_audit.render(result, by=by, sort=sort, fmt=fmt))
    if plot:
        report_audit.plot(result, plot)
        echo(f"heatmap: {plot}", err=fmt != "table")
    return result


def merge(ws: Workspace, recipe: Recipe, *, force: bool = False, dry_run: bool = False, as_json: bool = False,
          show_modules: bool = False, echo=print, progress=None):
    """``vecmerge project`` / ``refactor`` / ``run``: run the recipe and print its report.

    Args:
        ws (Workspace). recipe (Recipe): what to do. force (bool): replace outputs vecmerge wrote.
        dry_run (bool): write nothing. as_json (bool). show_modules (bool): also the per-module table.
    """
    rep = run(recipe, ws, dry_run=dry_run, force=force, progress=_bar(progress, recipe.kind))
    echo(to_json(rep.to_dict()) if as_json else render_merge(rep))
    if show_modules and not as_json:
        echo("\n" + render_modules(rep))
    return rep


def verify(ws: Workspace, targets: list[str], *, base_model=None, identities: bool = False, as_json: bool = False,
           echo=print, progress=None) -> dict:
    """``vecmerge verify``: re-derive an output from its manifest (or check identities); CheckFailed if any fails.

    Args:
        ws (Workspace): names for ``identities``; its ``base_model`` is the default ``base_model``.
        targets (list[str]): one output folder, or adapters with ``identities``.
        base_model (str | Path | None): a local transformers model folder: also load through PEFT.
    """
    bar = _bar(progress, "verify")
    if identities:
        result = verify_identities([ws.adapter(t) for t in targets], progress=bar)
    else:
        result = verify_output(targets[0], base_model=base_model or ws.base_model, progress=bar)
    echo(to_json(result) if as_json else report_verify.render(result))
    if not result["passed"]:
        failed = [c["name"] for c in result["checks"] if not c["passed"]]
        raise CheckFailed(f"{len(failed)} check(s) failed: {', '.join(failed)}")
    return result


def extract(base_model, tuned, out, *, rank: str, targets=("all-linear",), others=None, dtype: str = "fp32",
            seed: int = 0, force: bool = False, as_json: bool = False, show_modules: bool = False, echo=print,
            progress=None) -> dict:
    """``vecmerge extract``: a LoRA from a full fine-tune (``extract_output.extract``), then its report.

    Args:
        base_model, tuned (str | Path): model folders. out (str | Path). rank (str): N | energy:E | auto.
        targets (Iterable[str]). others (str | None): save | drop. dtype (str). seed (int). force (bool).
        as_json (bool): print the manifest. show_modules (bool): also the per-module table.
    """
    from .extract_output import extract as run_extract

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
    from .fuse import fuse as run_fuse

    man = run_fuse(adapter, base_model, out, dtype=dtype, force=force, progress=_bar(progress, "fuse"))
    echo(to_json(man) if as_json else report_model.render_fuse(man))
    return man
