"""``vecmerge probe`` once its flags are parsed: adapters teacher-forced on a prompt file, recorded, then the report."""

from __future__ import annotations

from pathlib import Path

from ..errors import UsageError, shown
from ..evidence.ledger.ledger import Ledger
from ..io.safe_text import printable
from ..outputs.transaction import PNG, OutputPolicy, write_file
from ..report import probe as report_probe
from ..report.format import to_json
from ..workspace.base_model import model_folder_problem
from ..workspace.names import Workspace
from .progress import progress_bar


def probe(ws: Workspace, names: list[str], *, prompts, base_model=None, batch: int = 8, pairs: bool = True,
          name: str | None = None, record: bool = True, plot=None, force: bool = False, as_json: bool = False,
          echo=print, progress=None) -> dict:
    """``vecmerge probe NAMES... --prompts FILE.jsonl [--base-model DIR] [--batch N] [--plot F.png]``.

    Each adapter's exact update on the base, teacher-forced on every item of the file (``probe.runner.run_probe``);
    what the ledger does not hold yet for these adapters' hashes and this file is computed and recorded there.

    Args:
        ws (Workspace): names, the base model, the ledger, the device. names (list[str]): adapters.
        prompts (str | Path): the prompt file. base_model (str | Path | None): default the workspace's.
        batch (int): items per forward pass. pairs (bool): KL/JS per pair. name (str | None): the metrics' stem.
        record (bool): write into the ledger (False: compute everything, write nothing).
        plot (str | Path | None): a PNG of the map and the distance matrix. force (bool): replace that PNG.
    """
    from ..probe.prompts import read_prompts
    from ..probe.runner import ProbeModel, run_probe

    base = Path(base_model) if base_model is not None else ws.base_model
    if base is None:
        raise UsageError("probe: give --base-model DIR (or base_model: in vecmerge.yaml)")
    problem = model_folder_problem(base)
    if problem:
        raise UsageError(f"--base-model {base}: {problem}")
    ledger = Ledger(ws.ledger_path)
    policy = None
    if plot:  # refused before any work
        policy = OutputPolicy.for_command(inputs=[ledger.path, Path(prompts), *([ws.file] if ws.file else [])],
                                          workspace_adapters=ws.adapters, base_model=base, force=force)
        policy.check_file(plot, PNG, flag="--plot")
    prompt_set = read_prompts(prompts, base, stem=name)
    models = [ProbeModel(n, ws.adapter(n), ws.content_sha(n)) for n in names]
    result = run_probe(base, models, prompt_set, ledger=ledger if record else None, batch=batch, pairs=pairs,
                       device=ws.device or "cpu", progress=progress_bar(progress, "probe"))
    out = result.to_dict()
    out["prompts"]["path"] = shown(out["prompts"]["path"])
    if out["recorded"]["ledger"]:
        out["recorded"]["ledger"] = shown(out["recorded"]["ledger"])
    if plot:
        write_file(plot, lambda f: report_probe.plot_probe(out, f), policy=policy, kind=PNG, flag="--plot")
    echo(to_json(out) if as_json else printable(report_probe.render_probe(out), keep_newlines=True))
    if plot:
        echo(f"plot: {plot}", err=as_json)
    return out
