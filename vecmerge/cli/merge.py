"""``vecmerge project``, ``merge``, ``refactor`` and ``run``: every command that writes an adapter from a recipe."""

from __future__ import annotations

import click

from ..recipe.docs import recipe_help
from .app import Ctx, handled, main, usage
from .recipe_flags import method_options, recipe_data, recipe_options, run_flags, run_mergekit, run_options, run_recipe


@main.command()
@recipe_options("project")
@method_options(stepped=True)
@run_options()
@click.pass_obj
@handled
def project(obj: Ctx, **given):
    """A trust-region step BASE + alpha*DIR, gated by consensus, written as a PEFT LoRA.

    With --only/--exclude the step is taken in the selected modules only; the others keep the backbone.

    Example: vecmerge project --base v54 --dir 'v51 - v28' --trust 0.0113 --consensus-ref 'v54 - v54e2' --out out/v58
    """
    flags = run_flags(given)
    if given.get("gate_metric") is not None and not given.get("gate"):
        usage("project: --metric only means something with --gate")
    run_recipe(obj, recipe_data(given), "project", flags)


@main.command()
@click.argument("models", nargs=-1, metavar="INPUT...")
@recipe_options("merge")
@click.option("--weights", help="Comma-separated weights, one per INPUT (default 1 each), e.g. 0.5,0.5.")
@click.option("--config", "config", type=click.Path(dir_okay=False),
              help="A mergekit merge configuration (YAML: merge_method, base_model, models with parameters, "
                   "gradients and filters, parameters, dtype, slices that select layers; rank) whose models are LoRA "
                   "adapters (workspace names or folders), instead of INPUT... and --method. mergekit's defaults "
                   "fill what it leaves out; the report says which, and where a method means something else on "
                   "LoRA updates (docs/METHODS.md); every key vecmerge does not support is named.")
@method_options(stepped=False)
@run_options()
@click.pass_obj
@handled
def merge(obj: Ctx, models, weights, config, **given):
    """The classic merges of INPUTs (adapter names or expressions such as 'v51 - v28'), written as a PEFT LoRA.

    Each method is applied to the updates scale*B@A themselves, never to the factors, and the output
    verifies like every other (vecmerge verify OUT). Per-model density and per-module multipliers:
    write a recipe (models: [{model: v28, weight: 0.5, density: 0.3}, ...]) and use vecmerge run, or
    a mergekit configuration (--config merge.yml).
    """
    flags = run_flags(given)
    if config is not None:
        typed = [w for w, v in (("INPUT", models), ("--weights", weights)) if v]
        return run_mergekit(obj, config, recipe_data(given), flags, typed=typed)
    if not models or given.get("method") is None:
        usage("merge: needs INPUT... and --method (or --config FILE.yml, a mergekit configuration)")
    ws = [1.0] * len(models)
    if weights is not None:
        try:
            ws = [float(w) for w in weights.split(",")]
        except ValueError:
            usage(f"--weights {weights}: comma-separated numbers, one per INPUT, e.g. 0.5,0.5")
        if len(ws) != len(models):
            usage(f"--weights {weights}: {len(ws)} weight(s) for {len(models)} INPUT(s); give one per INPUT")
    data = {**recipe_data(given), "models": [{"model": m, "weight": w} for m, w in zip(models, ws)]}
    run_recipe(obj, data, "merge", flags, named={"weights": "--weights"})


@main.command()
@click.argument("expression")
@recipe_options("refactor")
@run_options()
@click.pass_obj
@handled
def refactor(obj: Ctx, expression, **given):
    """Any EXPRESSION of adapters, re-factored to a LoRA of the chosen --rank.

    Example: vecmerge refactor '0.5*v16 + 0.5*v28' --rank 32 --out out/avg
    """
    flags = run_flags(given)
    rank = given.get("rank")
    if str(rank).strip().lower() == "keep-base":
        usage("refactor: --rank keep-base keeps a backbone's factors under a step; use 'vecmerge project' for "
              "that, or --rank exact")
    if str(rank).strip().lower().startswith("step-energy"):
        usage("refactor: --rank step-energy:E measures a step's energy, and refactor has no step; use --rank "
              "energy:E (the share of the whole update's energy)")
    run_recipe(obj, {**recipe_data(given), "base": expression}, "refactor", flags, named={"base": "EXPRESSION"})


@main.command("run", epilog=recipe_help())
@click.argument("recipe", type=click.Path(exists=True))
@recipe_options("run")
@run_options(force_help="Replace existing outputs.")
@click.pass_obj
@handled
def run_cmd(obj: Ctx, recipe, out, base_model_id, **given):
    """Run a YAML RECIPE (or re-run an output's vecmerge.json manifest, from any folder).

    The recipe's keys are listed below (the same as docs/RECIPES.md).
    """
    import dataclasses

    from .. import commands
    from ..errors import RecipeError
    from ..options import is_hub_id
    from ..recipe.load import load
    from .app import echo

    _not_a_model_manifest(recipe)
    r = load(recipe)
    if out:
        r = dataclasses.replace(r, out=out)
    if base_model_id:
        if not is_hub_id(base_model_id):
            raise RecipeError([f"--base-model-id {base_model_id!r}: a hub id such as Qwen/Qwen3-0.6B (ORG/NAME)"],
                              "options")
        r = dataclasses.replace(r, base_model_id=base_model_id)
    commands.merge(obj.ws(), r, run_flags(given), echo=echo, progress=obj.bars())


def _not_a_model_manifest(path) -> None:
    """``vecmerge run`` of an extract or fuse manifest: say which command made it (it is no recipe)."""
    from ..errors import VecmergeError
    from ..io.parse import load_json

    if str(path).endswith(".json"):
        try:
            data = load_json(path)
        except VecmergeError:
            return  # the recipe loader reports it
        if isinstance(data, dict) and data.get("kind") in ("extract", "fuse"):
            usage(f"run: {path} records a 'vecmerge {data['kind']}' output, not a recipe; run 'vecmerge "
                   f"{data['kind']}' again with its settings, or check the output with 'vecmerge verify'")
