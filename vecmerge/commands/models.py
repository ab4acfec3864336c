"""``extract`` and ``fuse`` once their flags are parsed: whole models in and out, then the report."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..report import models as report_model
from ..report.format import to_json
from ..requests import Extract, Fuse
from ..workspace.names import Workspace
from .printing import Echo
from .progress import progress_bar

if TYPE_CHECKING:  # torch: imported when a command runs
    from ..models.extract_write import ExtractReport
    from ..models.fuse import FuseReport


def extract(req: Extract, *, echo: Echo = print, progress=None, ws: Workspace | None = None) -> ExtractReport:
    """``vecmerge extract``: a LoRA from a full fine-tune (``models.extract_write.extract``), then its report
    (``--json``: the manifest; ``--modules``: also the per-module table). ``ws``: the workspace the manifest's
    paths start from (default: the current folder) and whose ``base_model_id`` names the base when its
    ``base_model`` is ``--base-model`` and no ``--base-model-id`` is given."""
    from pathlib import Path

    from ..models.extract_write import extract as run_extract

    hub = req.base_model_id
    if hub is None and ws is not None and ws.base_model is not None and ws.base_model == Path(req.base_model).resolve():
        hub = ws.base_model_id
    man = run_extract(req.base_model, req.tuned, req.out, rank=req.rank, targets=req.target_list, others=req.others,
                      dtype=req.dtype, seed=req.seed, force=req.force, progress=progress_bar(progress, "extract"),
                      home=ws.home if ws is not None else None, base_model_id=hub)
    echo(to_json(man) if req.as_json else report_model.render_extract(man, req.show_modules))
    return man


def fuse(ws: Workspace, req: Fuse, *, echo: Echo = print, progress=None) -> FuseReport:
    """``vecmerge fuse``: ADAPTER (a workspace name, else a folder) added into the base model's weights
    (``--base-model``, else the workspace's), written as a plain model; then its report."""
    from ..errors import UsageError
    from ..models.fuse import fuse as run_fuse

    base_model = req.base_model or ws.base_model
    if base_model is None:
        raise UsageError("fuse: give --base-model (or base_model in vecmerge.yaml)")
    adapter = ws.path_of(req.adapter)  # a name in vecmerge.yaml, as every command reads it, else a folder
    man = run_fuse(adapter, base_model, req.out, dtype=req.dtype, force=req.force,
                   progress=progress_bar(progress, "fuse"), home=ws.home)
    echo(to_json(man) if req.as_json else report_model.render_fuse(man))
    return man
