"""``project``, ``merge``, ``refactor``, ``run`` and ``verify`` once their flags are parsed: pipeline, then report."""

from __future__ import annotations

from pathlib import Path

from ..errors import CheckFailed, RecipeError
from ..pipeline import run
from ..pipeline.gate_check import GateFailed
from ..recipe.recipe import Recipe
from ..report import evidence as report_evidence
from ..report import verify as report_verify
from ..report.format import to_json
from ..report.merge import render_merge, render_modules
from ..requests import RunFlags, Verify
from ..verify.checks.output import verify_identities, verify_output
from ..verify.report import VerifyReport
from ..workspace.names import Workspace
from .gate import gate_dict
from .printing import Echo
from .progress import progress_bar


def merge(ws: Workspace, recipe: Recipe, flags: RunFlags, *, echo: Echo = print, progress=None):
    """``vecmerge project`` / ``refactor`` / ``merge`` / ``run``: run the recipe and print its report.

    Args:
        ws (Workspace). recipe (Recipe): what to do. flags (RunFlags): ``--force`` (replace outputs vecmerge
            wrote), ``--dry-run`` (write nothing), ``--json``, ``--modules`` (also the per-module table).
    """
    try:
        rep = run(recipe, ws, dry_run=flags.dry_run, force=flags.force, progress=progress_bar(progress, recipe.kind))
    except GateFailed as e:  # the gate's table, then the error line
        table = gate_dict(e.check)
        echo(to_json({"gate": table}) if flags.as_json else report_evidence.render_gate(table))
        raise
    if rep.gate is not None and not flags.as_json:
        g = rep.gate
        where = "" if flags.dry_run else "; its table is in each output's vecmerge.json and README.md"
        echo(f"gate ({g.backbone} + alpha * ({g.x} - {g.y}), metric {g.metric}): "
             f"{report_evidence.gate_verdict(g.to_dict())}{where} (vecmerge gate shows it)\n")
    echo(to_json(rep.to_dict()) if flags.as_json else render_merge(rep))
    if flags.show_modules and not flags.as_json:
        echo("\n" + render_modules(rep))
    return rep


def merge_config(ws: Workspace, path, keys: dict, flags: RunFlags, *, echo: Echo = print, progress=None):
    """``vecmerge merge --config FILE``: a mergekit configuration translated to a recipe (``recipe.mergekit``), the
    flags' recipe keys over it, run as ``merge``; the manifest keeps the file's sha256 (``config``).

    Args:
        ws (Workspace). path (str | Path): the YAML. keys (dict): recipe keys given as flags (rank, out, ...).
        flags (RunFlags): as ``merge``'s.
    """
    import hashlib

    from ..io.parse import YAML_MAX_BYTES, ParseError, parse_yaml, read_text
    from ..recipe.mergekit import from_mergekit

    path = Path(path)
    try:
        text = read_text(path, max_bytes=YAML_MAX_BYTES)
        data = parse_yaml(text, path)
    except ParseError as e:
        raise RecipeError([e.problem], e.source if e.line is None else f"{e.source}:{e.line}") from None
    sha = hashlib.sha256(text.encode("utf-8")).hexdigest()  # the bytes read (valid UTF-8 re-encodes to them)
    rec, notes = from_mergekit(data, str(path), path.parent.resolve(), known=set(ws.adapters),
                               layers=lambda name, inputs: _layers(ws, name, inputs))
    recipe = Recipe.from_dict({**rec, **keys}, str(path), root=path.parent.resolve())
    said = notes["notes"] + _check_hub_base(ws, recipe, notes["base_model"], rec.get("base_model_id"))
    source = {"format": "mergekit", "path": str(path), "sha256": sha, "merge_method": notes["mergekit_method"],
              "base_model": notes["base_model"], "mergekit_defaults": notes["defaults"], "notes": said}
    if not flags.as_json:
        echo(f"config: {path} (mergekit {notes['mergekit_method']} -> vecmerge {recipe.method}; sha256 {sha[:12]})")
        if notes["defaults"]:
            echo("config: mergekit's defaults for what the file leaves out: "
                 + ", ".join(f"{k}: {str(v).lower()}" for k, v in notes["defaults"].items()))
        for line in said:
            echo(f"config note: {line}")
    rep = run(recipe, ws, dry_run=flags.dry_run, force=flags.force, progress=progress_bar(progress, recipe.kind),
              source=source)
    echo(to_json({**rep.to_dict(), "config": source}) if flags.as_json else render_merge(rep))
    if flags.show_modules and not flags.as_json:
        echo("\n" + render_modules(rep))
    return rep


def _layers(ws: Workspace, name: str, inputs: dict) -> int | None:
    """The number of layers an adapter's modules span (its highest layer index + 1), None when unreadable."""
    from ..errors import VecmergeError
    from ..peft.format import module_layer

    try:
        modules = (ws.with_inputs({k: v["path"] for k, v in inputs.items()}) if inputs else ws).adapter(
            name, "drop").modules
    except (VecmergeError, OSError):
        return None  # the run itself reports the adapter's problem
    found = [n for n in (module_layer(m) for m in modules) if n is not None]
    return max(found) + 1 if found else None


def _check_hub_base(ws: Workspace, recipe: Recipe, base: str | None, hub_id: str | None) -> list[str]:
    """The file's hub base_model against each adapter's base_model_name_or_path: RecipeError when a declared hub
    id differs (unless allow_base_mismatch), a note for adapters that declare a local path instead."""
    from ..errors import VecmergeError
    from ..options import is_hub_id

    if hub_id is None or base is None:
        return []
    wsi = ws.with_inputs({k: v["path"] for k, v in recipe.inputs.items()}) if recipe.inputs else ws
    other, local = [], []
    for entry in recipe.models or []:
        name = str(entry["model"])
        try:
            declared = wsi.adapter(name, "drop").config.base_model
        except (VecmergeError, OSError):
            continue  # the run itself reports the adapter's problem
        if declared and is_hub_id(declared) and "/" in declared and declared != hub_id:
            other.append(f"{name} ({declared})")
        elif declared != hub_id:  # a local path, or a bare name that may be one: nothing to compare
            local.append(name)
    if other and not recipe.allow_base_mismatch:
        raise RecipeError([f"base_model: {hub_id} is not the base model the adapters declare: "
                           f"{', '.join(other)}; fix base_model, or pass --allow-base-mismatch"], "config")
    return [f"base_model {hub_id}: not checked against {', '.join(local)}, which declare no hub id (ORG/NAME) as "
            "base_model_name_or_path"] if local else []


def verify(ws: Workspace, req: Verify, *, echo: Echo = print, progress=None,
           workspace_given: bool = False) -> VerifyReport:
    """``vecmerge verify``: re-derive an output from its manifest (or check identities); CheckFailed if any fails.

    The workspace names the ``--identities`` adapters; its ``base_model`` is the default ``--base-model`` (and its
    ``base_model_id`` the hub id that folder stands for).

    Args:
        ws (Workspace). req (Verify): one output folder, or adapters with ``--identities``.
        workspace_given (bool): ``--workspace`` was given: the manifest's relative input paths start at its
            folder (an output moved or copied out of the workspace it was made in).
    """
    targets = list(req.target)
    bar = progress_bar(progress, "verify")
    if req.identities:
        labels = [t if t in ws.adapters else Path(t).name or t for t in targets]  # workspace names as typed
        result = verify_identities([ws.adapter(t, "drop") for t in targets], progress=bar, labels=labels)
    else:
        aliases = {ws.base_model: ws.base_model_id} if ws.base_model and ws.base_model_id else None
        result = verify_output(targets[0], base_model=req.base_model or ws.base_model, progress=bar,
                               allow_base_mismatch=req.allow_base_mismatch, base_model_aliases=aliases,
                               workspace=ws.home if workspace_given else None)
    echo(to_json(result) if req.as_json else report_verify.render(result))
    if not result["passed"]:
        failed = [c["name"] for c in result["checks"] if c["passed"] is False]
        raise CheckFailed(f"{len(failed)} check(s) failed: {', '.join(failed)}")
    return result
