"""``vecmerge probe``: checkpoints teacher-forced on a prompt file; function-space evidence into the ledger."""

from __future__ import annotations

import click

from .app import Ctx, echo, global_options, handled, json_option, main, usage


@main.command()
@click.argument("names", nargs=-1, required=True)
@click.option("--prompts", required=True, type=click.Path(dir_okay=False),
              help="JSON Lines: id, prompt or prompt_ids, target or target_ids, optional task and cluster.")
@click.option("--base-model", type=click.Path(file_okay=False),
              help="The base model folder (default: base_model in vecmerge.yaml); its tokenizer encodes text.")
@click.option("--batch", type=int, default=8, show_default=True, help="Items per forward pass.")
@click.option("--name", help="The metrics' stem, probe:NAME:loglik (default: the prompt file's name).")
@click.option("--pairs/--no-pairs", default=True, show_default=True,
              help="KL and JS between every pair of adapters (each pair needs both forward passes).")
@click.option("--record/--no-record", default=True, show_default=True,
              help="Write into the ledger, and reuse what it holds (--no-record: compute everything, write nothing).")
@click.option("--plot", type=click.Path(dir_okay=False), help="A PNG: the 2-D map and the distance heatmap.")
@click.option("--force", is_flag=True, help="Replace an existing --plot PNG.")
@json_option
@global_options
@click.pass_obj
@handled
def probe(obj: Ctx, names, prompts, base_model, batch, name, pairs, record, plot, force, as_json):
    """Teacher-force each adapter on PROMPTS: loglik, exact, first-token rank per item; KL/JS per pair.

    The base is loaded once (float32, --device); each adapter's exact update s*B@A is added by hooks, so the
    outputs equal a PEFT-loaded model's and the base is never changed. Results go into the ledger tied to each
    adapter's sha256 and the prompt file's; a re-run computes only what is missing.
    """
    if batch < 1:
        usage(f"--batch {batch}: at least 1 item per forward pass")
    if len(set(names)) != len(names):
        usage(f"probe: name each adapter once (got {' '.join(names)})")
    from .. import commands

    commands.probe(obj.ws(), list(names), prompts=prompts, base_model=base_model, batch=batch, pairs=pairs, name=name,
                   record=record, plot=plot, force=force, as_json=as_json, echo=echo, progress=obj.bars())
