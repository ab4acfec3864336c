"""``vecmerge probe`` once its flags are parsed: adapters teacher-forced on a prompt file, recorded, then the report."""

from __future__ import annotations

from pathlib import Path

from ..errors import shown
from ..evidence.ledger.ledger import Ledger
from ..io.safe_text import printable
from ..outputs.transaction import PNG, OutputPolicy, write_file
from ..report import probe as report_probe
from ..report.format import to_json
from ..requests import Probe
from ..workspace.base_model import checked_model_folder
from ..workspace.names import Workspace
from .printing import Echo
from .progress import progress_bar


def probe(ws: Workspace, req: Probe, *, echo: Echo = print, progress=None) -> dict:
    """``vecmerge probe NAMES... --prompts FILE.jsonl [--base-model DIR] [--batch N] [--plot F.png]``.

    Each adapter's exact update on the base, teacher-forced on every item of the file (``probe.runner.run_probe``);
    what the ledger does not hold yet for these adapters' hashes and this file is computed and recorded there
    (``--no-record``: compute everything, write nothing). ``--plot``: a PNG of the map and the distance matrix.
    """
    from ..probe.prompts import read_prompts
    from ..probe.runner import ProbeModel, run_probe

    base = checked_model_folder(req.base_model, ws.base_model, "probe")
    ledger = Ledger(ws.ledger_path)
    policy = None
    if req.plot:  # refused before any work
        policy = OutputPolicy.for_command(inputs=[ledger.path, Path(req.prompts), *([ws.file] if ws.file else [])],
                                          workspace_adapters=ws.adapters, base_model=base, force=req.force)
        policy.check_file(req.plot, PNG, flag="--plot")
    prompt_set = read_prompts(req.prompts, base, stem=req.name)
    models = [ProbeModel(n, ws.adapter(n), ws.content_sha(n)) for n in req.names]
    result = run_probe(base, models, prompt_set, ledger=ledger if req.record else None, batch=req.batch,
                       pairs=req.pairs, device=ws.device or "cpu", progress=progress_bar(progress, "probe"))
    out = result.to_dict()
    out["prompts"]["path"] = shown(out["prompts"]["path"])
    if out["recorded"]["ledger"]:
        out["recorded"]["ledger"] = shown(out["recorded"]["ledger"])
    if req.plot and policy is not None:
        write_file(req.plot, lambda f: report_probe.plot_probe(out, f), policy=policy, kind=PNG, flag="--plot")
    echo(to_json(out) if req.as_json else printable(report_probe.render_probe(out), keep_newlines=True))
    if req.plot:
        echo(f"plot: {req.plot}", err=req.as_json)
    return out
