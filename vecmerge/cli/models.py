"""``vecmerge extract`` and ``vecmerge fuse``: whole models in and out."""

from __future__ import annotations

import click

from ..options import (
    DTYPE_NAMES,
    EXTRACT_OTHERS,
    EXTRACT_OTHERS_HELP,
    EXTRACT_RANK_HELP,
    EXTRACT_TARGETS_HELP,
    FUSE_DTYPE_HELP,
)
from .app import Ctx, echo, global_options, handled, main, usage


@main.command()
@click.option("--base-model", required=True, type=click.Path(file_okay=False), help="The base model folder.")
@click.option("--tuned", required=True, type=click.Path(file_okay=False), help="The fully fine-tuned model folder.")
@click.option("--rank", required=True, help=EXTRACT_RANK_HELP + ".")
@click.option("--targets", default="all-linear", show_default=True, help=EXTRACT_TARGETS_HELP + ".")
@click.option("--others", type=click.Choice(EXTRACT_OTHERS), default=None, help=EXTRACT_OTHERS_HELP + ".")
@click.option("--dtype", type=click.Choice(DTYPE_NAMES), default="fp32", show_default=True,
              help="dtype of the written factors.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the randomized range finder.")
@click.option("--base-model-id", default=None, help="Hub id of the base model (ORG/NAME), written as "
              "base_model_name_or_path and in the model card (default: base_model_id in vecmerge.yaml when its "
              "base_model is --base-model, else the local folder).")
@click.option("--out", required=True, type=click.Path(file_okay=False), help="Output adapter folder.")
@click.option("--force", is_flag=True, help="Replace an existing --out that vecmerge wrote.")
@click.option("--json", "as_json", is_flag=True, help="Print the manifest instead of the report.")
@click.option("--modules", "show_modules", is_flag=True, help="Also print the per-module table.")
@global_options
@click.pass_obj
@handled
def extract(obj: Ctx, base_model, tuned, rank, targets, others, dtype, seed, base_model_id, out, force, as_json,
            show_modules):
    """A LoRA from a full fine-tune: each module's difference cut at --rank, with its exact error."""
    from pathlib import Path

    from .. import commands
    from ..options import is_hub_id

    ws = obj.ws()
    if base_model_id is not None and not is_hub_id(base_model_id):
        usage(f"--base-model-id {base_model_id!r}: a hub id such as Qwen/Qwen3-0.6B (ORG/NAME)")
    if base_model_id is None and ws.base_model is not None and ws.base_model == Path(base_model).resolve():
        base_model_id = ws.base_model_id
    commands.extract(base_model, tuned, out, rank=rank, targets=[t for t in targets.split(",") if t.strip()],
                     others=others, dtype=dtype, seed=seed, force=force, as_json=as_json, show_modules=show_modules,
                     echo=echo, progress=obj.bars(), home=ws.home, base_model_id=base_model_id)


@main.command()
@click.argument("adapter", type=click.Path(file_okay=False))
@click.option("--base-model", type=click.Path(file_okay=False),
              help="The base model folder (default: the workspace's base_model).")
@click.option("--out", required=True, type=click.Path(file_okay=False), help="Output model folder.")
@click.option("--dtype", type=click.Choice(DTYPE_NAMES), default=None, help=FUSE_DTYPE_HELP + ".")
@click.option("--force", is_flag=True, help="Replace an existing --out that vecmerge wrote.")
@click.option("--json", "as_json", is_flag=True, help="Print the manifest instead of the report.")
@global_options
@click.pass_obj
@handled
def fuse(obj: Ctx, adapter, base_model, out, dtype, force, as_json):
    """ADAPTER (a workspace name or a folder) added into the base model's weights, written as a plain sharded
    safetensors model."""
    ws = obj.ws()
    base_model = base_model or ws.base_model
    if base_model is None:
        usage("fuse: give --base-model (or base_model in vecmerge.yaml)")
    adapter = ws.path_of(adapter)  # a name in vecmerge.yaml, as every command reads it, else a folder
    from .. import commands

    commands.fuse(adapter, base_model, out, dtype=dtype, force=force, as_json=as_json, echo=echo,
                  progress=obj.bars(), home=ws.home)
