"""``extract`` and ``fuse`` once their flags are parsed: whole models in and out, then the report."""

from __future__ import annotations

from ..report import models as report_model
from ..report.format import to_json
from .progress import progress_bar


def extract(base_model, tuned, out, *, rank: str, targets=("all-linear",), others=None, dtype: str = "fp32",
            seed: int = 0, force: bool = False, as_json: bool = False, show_modules: bool = False, echo=print,
            progress=None, home=None, base_model_id: str | None = None) -> dict:
    """``vecmerge extract``: a LoRA from a full fine-tune (``extract_output.extract``), then its report.

    Args:
        base_model, tuned (str | Path): model folders. out (str | Path). rank (str): N | energy:E | auto.
        targets (Iterable[str]). others (str | None): save | drop. dtype (str). seed (int). force (bool).
        as_json (bool): print the manifest. show_modules (bool): also the per-module table.
        home (str | Path | None): the workspace folder (paths in the manifest start there).
        base_model_id (str | None): the base's hub id for the config and the card.
    """
    from ..models.extract_write import extract as run_extract

    man = run_extract(base_model, tuned, out, rank=rank, targets=targets, others=others, dtype=dtype, seed=seed,
                      force=force, progress=progress_bar(progress, "extract"), home=home,
                      base_model_id=base_model_id)
    echo(to_json(man) if as_json else report_model.render_extract(man, show_modules))
    return man


def fuse(adapter, base_model, out, *, dtype=None, force: bool = False, as_json: bool = False, echo=print,
         progress=None, home=None) -> dict:
    """``vecmerge fuse``: ADAPTER added into BASE's weights, written as a plain model; then its report.

    Args:
        adapter (str | Path): a PEFT LoRA folder. base_model (str | Path). out (str | Path).
        dtype (str | None): fp32 | bf16 | fp16, or None (stored dtypes). force (bool). as_json (bool).
        home (str | Path | None): the workspace folder (paths in the manifest start there).
    """
    from ..models.fuse import fuse as run_fuse

    man = run_fuse(adapter, base_model, out, dtype=dtype, force=force, progress=progress_bar(progress, "fuse"),
                   home=home)
    echo(to_json(man) if as_json else report_model.render_fuse(man))
    return man
