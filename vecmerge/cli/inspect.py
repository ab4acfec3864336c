"""``vecmerge inspect`` and ``vecmerge audit``: what adapters are, and how trajectories agree."""

from __future__ import annotations

import click

from ..options import (
    AUDIT_SORT_HELP,
    AUDIT_SORTS,
    AUDIT_VIEW_HELP,
    AUDIT_VIEWS,
    MODULES_TO_SAVE,
    REPORT_FORMAT_HELP,
    REPORT_FORMATS,
)
from ..recipe.keys import KEY
from .app import Ctx, echo, global_options, handled, main, usage


@main.command()
@click.argument("adapters", nargs=-1, required=True)
@click.option("--base-model", type=click.Path(file_okay=False),
              help="A local base model folder (transformers, safetensors): DoRA adapters are described by their "
                   "effective update m * (W + sBA) / ||W + sBA|| - W against its weights (needed for DoRA; default "
                   "the workspace's base_model).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@global_options
@click.pass_obj
@handled
def inspect(obj: Ctx, adapters, base_model, as_json):
    """Config, scale rule, ranks, dtype, norms and sha256 of each ADAPTER (name or folder).

    DoRA adapters need --base-model; lora_bias adapters also show the norm of their bias updates.
    """
    from .. import commands

    commands.inspect(obj.ws(), list(adapters), base_model=base_model, as_json=as_json, echo=echo,
                     progress=obj.bars())


@main.command()
@click.argument("adapters", nargs=-1)
@click.option("--ref", help="Reference trajectory expression, e.g. 'v54 - v54e2'.")
@click.option("--dir", "direction", help="Direction expression, e.g. 'v51 - v28'.")
@click.option("--by", type=click.Choice(AUDIT_VIEWS), default="module", show_default=True, help=AUDIT_VIEW_HELP)
@click.option("--sort", type=click.Choice(AUDIT_SORTS), default="module", show_default=True, help=AUDIT_SORT_HELP)
@click.option("--format", "fmt", type=click.Choice(REPORT_FORMATS), default="table", show_default=True,
              help=REPORT_FORMAT_HELP)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output: the same as --format json.")
@click.option("--plot", type=click.Path(dir_okay=False),
              help="Also write a cosine heatmap PNG, layers x module types (needs matplotlib).")
@click.option("--force", is_flag=True, help="Replace an existing --plot PNG.")
@click.option("--allow-missing", is_flag=True,
              help=KEY["allow_missing"].describe() + " Audits count them apart (not compared).")
@click.option("--samples", type=int, default=200, show_default=True,
              help="Random rotations per module for the chance band; 0 for the analytic band 1.96/sqrt(out*in).")
@click.option("--modules-to-save", type=click.Choice(MODULES_TO_SAVE), default="refuse", show_default=True,
              help=KEY["modules_to_save"].describe())
@click.option("--allow-base-mismatch", is_flag=True, help=KEY["allow_base_mismatch"].describe())
@global_options
@click.pass_obj
@handled
def audit(obj: Ctx, adapters, ref, direction, by, sort, fmt, as_json, plot, force, allow_missing, samples,
          modules_to_save, allow_base_mismatch):
    """Per-module sign consensus and cosine: --ref EXPR --dir EXPR, or pairwise over ADAPTERS."""
    if as_json and fmt not in ("table", "json"):
        usage(f"audit: --json and --format {fmt} ask for two formats; give one")
    fmt = "json" if as_json else fmt
    if (ref is None) != (direction is None):
        given, lacking = ("--ref", "--dir") if ref is not None else ("--dir", "--ref")
        usage(f"audit: {given} needs {lacking} too; e.g. --ref 'v54 - v54e2' --dir 'v51 - v28'")
    if ref is not None and adapters:
        usage("audit: give either --ref/--dir or ADAPTERS for a pairwise matrix, not both")
    if ref is None and len(adapters) < 2:
        what = f"only one adapter ({adapters[0]})" if adapters else "nothing to audit"
        usage(f"audit: {what}; pass --ref EXPR --dir EXPR, or two or more ADAPTERS to compare")
    if samples < 0:
        usage(f"--samples {samples}: give 0 (analytic band) or a positive number of draws")
    from .. import commands

    commands.audit(obj.ws(), ref=ref, direction=direction, adapters=adapters, by=by, sort=sort, fmt=fmt, plot=plot,
                   allow_missing=allow_missing, samples=samples, modules_to_save=modules_to_save,
                   allow_base_mismatch=allow_base_mismatch, force=force, echo=echo, progress=obj.bars())
