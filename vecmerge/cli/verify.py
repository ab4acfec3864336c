"""``vecmerge verify``: an output re-derived and checked before it is uploaded."""

from __future__ import annotations

import click

from .app import Ctx, echo, global_options, handled, main, usage


@main.command()
@click.argument("target", nargs=-1, required=True)
@click.option("--base-model", type=click.Path(exists=True, file_okay=False),
              help="Local transformers model folder (config.json and weights) of the model the output declares: "
                   "load through PEFT and compare deltas, logits and merge_and_unload (default: the workspace's "
                   "base_model).")
@click.option("--allow-base-mismatch", is_flag=True,
              help="Run the PEFT checks even when --base-model is not the model the output declares.")
@click.option("--identities", is_flag=True, help="Check algebraic identities of TARGET adapters (no manifest).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable report.")
@global_options
@click.pass_obj
@handled
def verify(obj: Ctx, target, base_model, allow_base_mismatch, identities, as_json):
    """Re-derive an output from its manifest and check every identity; exit 1 if any check fails."""
    if identities and base_model:
        usage("verify: --base-model needs an output folder with a manifest; drop it with --identities")
    if not identities and len(target) != 1:
        usage("verify takes one output folder (or --identities ADAPTER...)")
    from .. import commands

    commands.verify(obj.ws(), list(target), base_model=base_model, identities=identities, as_json=as_json,
                    allow_base_mismatch=allow_base_mismatch, echo=echo, progress=obj.bars(),
                    workspace_given=obj.workspace is not None)
