"""``vecmerge project``, ``merge``, ``refactor`` and ``run``: every command that writes an adapter from a recipe."""

from __future__ import annotations

import click

from .. import methods
from ..options import (
    BASE_MODEL_ID_HELP,
    ON_DISAGREE,
    ON_DISAGREE_HELP,
    SCOPE_HELP,
    SCOPES,
)
from ..recipe.recipe import recipe_help
from .app import Ctx, echo, global_options, handled, main, usage
from .recipe_flags import merge_options, method_help, method_options, run_mergekit, run_recipe, selection_options


@main.command()
@click.option("--base", required=True, help="Backbone expression, e.g. v54 (the adapter you step from).")
@click.option("--dir", "direction", required=True, help="Direction expression, e.g. 'v51 - v28'.")
@click.option("--trust", type=float, help="Relative step T: alpha = T*||base||/||dir|| (0.0113 moves 1.13% of the "
              "backbone's norm).")
@click.option("--trust-scope", type=click.Choice(SCOPES), default="global", show_default=True, help=SCOPE_HELP)
@click.option("--alpha", type=float, help="Alpha directly; with --trust, trust is a bound on it.")
@click.option("--consensus-ref", help="Reference trajectory, e.g. 'v54 - v54e2': each module agrees when "
              "<ref_m, dir_m> > 0; see --on-disagree.")
@click.option("--on-disagree", type=click.Choice(ON_DISAGREE), default="fail", show_default=True,
              help=ON_DISAGREE_HELP)
@click.option("--min-agree", type=float, help="Fail below this share (0..1) of modules agreeing in sign.")
@click.option("--mode", type=click.Choice(methods.names(stepped=True)), default="add", show_default=True,
              help="How each module's direction is shaped before alpha is chosen. " + method_help(stepped=True)
              + ".")
@click.option("--dose", help="Comma-separated multiples of alpha, one output each at OUT-x<k>, e.g. 0.5,1,1.456.")
@click.option("--strict", is_flag=True, help="Fail (exit 1, nothing written) on any warning: less than 99% of the "
              "step survives, the written update misses it by over 10% of the step, dtype rounding, a step over "
              "half the backbone's norm, inputs of different base models.")
@click.option("--gate", "run_gate", is_flag=True, help="Run the six-condition gate first (see 'vecmerge gate'); "
              "write nothing unless every condition passes. The output's manifest and card carry its table.")
@click.option("--metric", help="With --gate: the ledger metric for the backbone and evidence conditions.")
@selection_options
@method_options(stepped=True)
@merge_options(stepped=True)
@click.pass_obj
@handled
def project(obj: Ctx, base, direction, trust, trust_scope, alpha, consensus_ref, on_disagree, min_agree, mode,
            dose, strict, run_gate, metric, only, exclude, rank, dtype, out, force, allow_missing, modules_to_save,
            allow_base_mismatch, base_model_id, base_model, dry_run, as_json, show_modules, **method_fields):
    """A trust-region step BASE + alpha*DIR, gated by consensus, written as a PEFT LoRA.

    With --only/--exclude the step is taken in the selected modules only; the others keep the backbone.

    Example: vecmerge project --base v54 --dir 'v51 - v28' --trust 0.0113 --consensus-ref 'v54 - v54e2' --out out/v58
    """
    if metric is not None and not run_gate:
        usage("project: --metric only means something with --gate")
    cons = None
    if consensus_ref:
        cons = {"ref": consensus_ref, "on_disagree": on_disagree, "min_agree": min_agree}
    data = {"base": base, "dir": direction, "trust": trust, "trust_scope": trust_scope, "alpha": alpha,
            "consensus": cons, "mode": mode, "rank": rank, "dose": dose, "out": out, "dtype": dtype,
            "allow_missing": allow_missing, "modules_to_save": modules_to_save, "strict": strict,
            "allow_base_mismatch": allow_base_mismatch or None, "base_model_id": base_model_id,
            "base_model": base_model,
            "gate": ({"metric": metric} if metric else True) if run_gate else None, "only": only, "exclude": exclude,
            **method_fields}
    run_recipe(obj, data, force=force, dry_run=dry_run, as_json=as_json, show_modules=show_modules)


@main.command()
@click.argument("models", nargs=-1, metavar="INPUT...")
@click.option("--method", type=click.Choice(methods.merge_names()),
              help="; ".join(f"{m}: {methods.get(m).summary}" for m in methods.merge_names()) + ".")
@click.option("--config", "config", type=click.Path(dir_okay=False),
              help="A mergekit merge configuration (YAML: merge_method, base_model, models with parameters, "
                   "parameters, dtype, slices that select layers) whose models are LoRA adapters (workspace names "
                   "or folders), instead of INPUT... and --method; every key vecmerge does not support is named. "
                   "docs/METHODS.md says where each method differs from mergekit's.")
@click.option("--weights", help="Comma-separated weights, one per INPUT (default 1 each), e.g. 0.5,0.5.")
@click.option("--strict", is_flag=True, help="Fail (exit 1, nothing written) when less than 99% of the intended "
              "merge survives the rank cut.")
@selection_options
@method_options(stepped=False)
@merge_options(stepped=False, rank_note="Default exact; svd and --space full need a rank.")
@click.pass_obj
@handled
def merge(obj: Ctx, models, method, config, weights, strict, only, exclude, rank, dtype, out, force, allow_missing,
          modules_to_save, allow_base_mismatch, base_model_id, base_model, dry_run, as_json, show_modules,
          **method_fields):
    """The classic merges of INPUTs (adapter names or expressions such as 'v51 - v28'), written as a PEFT LoRA.

    Each method is applied to the updates scale*B@A themselves, never to the factors, and the output
    verifies like every other (vecmerge verify OUT). Per-model density and per-module multipliers:
    write a recipe (models: [{model: v28, weight: 0.5, density: 0.3}, ...]) and use vecmerge run, or
    a mergekit configuration (--config merge.yml).
    """
    if config is not None:
        given = [f for f, v in (("INPUT", models), ("--method", method), ("--weights", weights)) if v]
        given += [f"--{k.replace('_', '-')}" for k, v in method_fields.items() if v is not None]
        if given:
            usage(f"merge --config: {', '.join(given)} come from {config}; edit the file, or leave --config out")
        data = {"rank": rank, "out": out, "dtype": dtype if dtype != "fp32" else None,
                "allow_missing": allow_missing, "modules_to_save": modules_to_save, "strict": strict, "only": only,
                "exclude": exclude, "allow_base_mismatch": allow_base_mismatch or None, "base_model_id": base_model_id,
                "base_model": base_model}
        return run_mergekit(obj, config, data, force=force, dry_run=dry_run, as_json=as_json,
                            show_modules=show_modules)
    if not models or method is None:
        usage("merge: needs INPUT... and --method (or --config FILE.yml, a mergekit configuration)")
    ws = [1.0] * len(models)
    if weights is not None:
        try:
            ws = [float(w) for w in weights.split(",")]
        except ValueError:
            usage(f"--weights {weights}: comma-separated numbers, one per INPUT, e.g. 0.5,0.5")
        if len(ws) != len(models):
            usage(f"--weights {weights}: {len(ws)} weight(s) for {len(models)} INPUT(s); give one per INPUT")
    data = {"method": method, "models": [{"model": m, "weight": w} for m, w in zip(models, ws)], "rank": rank,
            "out": out, "dtype": dtype, "allow_missing": allow_missing, "modules_to_save": modules_to_save,
            "strict": strict, "only": only, "exclude": exclude, "allow_base_mismatch": allow_base_mismatch or None,
            "base_model_id": base_model_id, "base_model": base_model, **method_fields}
    run_recipe(obj, data, force=force, dry_run=dry_run, as_json=as_json, show_modules=show_modules)


@main.command()
@click.argument("expression")
@merge_options(stepped=False)
@click.pass_obj
@handled
def refactor(obj: Ctx, expression, rank, dtype, out, force, allow_missing, modules_to_save, allow_base_mismatch,
             base_model_id, base_model, dry_run, as_json, show_modules):
    """Any EXPRESSION of adapters, re-factored to a LoRA of the chosen --rank.

    Example: vecmerge refactor '0.5*v16 + 0.5*v28' --rank 32 --out out/avg
    """
    if str(rank).strip().lower() == "keep-base":
        usage("refactor: --rank keep-base keeps a backbone's factors under a step; use 'vecmerge project' for "
               "that, or --rank exact")
    if str(rank).strip().lower().startswith("step-energy"):
        usage("refactor: --rank step-energy:E measures a step's energy, and refactor has no step; use --rank "
               "energy:E (the share of the whole update's energy)")
    data = {"base": expression, "rank": rank, "out": out, "dtype": dtype, "allow_missing": allow_missing,
            "modules_to_save": modules_to_save, "allow_base_mismatch": allow_base_mismatch or None,
            "base_model_id": base_model_id, "base_model": base_model}
    run_recipe(obj, data, force=force, dry_run=dry_run, as_json=as_json, show_modules=show_modules)


@main.command("run", epilog=recipe_help())
@click.argument("recipe", type=click.Path(exists=True))
@click.option("--out", type=click.Path(file_okay=False), help="Override the recipe's out.")
@click.option("--force", is_flag=True, help="Replace existing outputs.")
@click.option("--base-model-id", help="Override the recipe's base_model_id. " + BASE_MODEL_ID_HELP)
@click.option("--dry-run", is_flag=True, help="Print the plan and report; write nothing.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable report.")
@click.option("--modules", "show_modules", is_flag=True, help="Also print the per-module table.")
@global_options
@click.pass_obj
@handled
def run_cmd(obj: Ctx, recipe, out, force, base_model_id, dry_run, as_json, show_modules):
    """Run a YAML RECIPE (or re-run an output's vecmerge.json manifest, from any folder).

    The recipe's keys are listed below (the same as docs/RECIPES.md).
    """
    import dataclasses

    from .. import commands
    from ..errors import RecipeError
    from ..options import is_hub_id
    from ..recipe.recipe import load

    _not_a_model_manifest(recipe)
    r = load(recipe)
    if out:
        r = dataclasses.replace(r, out=out)
    if base_model_id:
        if not is_hub_id(base_model_id):
            raise RecipeError([f"--base-model-id {base_model_id!r}: a hub id such as Qwen/Qwen3-0.6B (ORG/NAME)"],
                              "options")
        r = dataclasses.replace(r, base_model_id=base_model_id)
    commands.merge(obj.ws(), r, force=force, dry_run=dry_run, as_json=as_json, show_modules=show_modules,
                   echo=echo, progress=obj.bars())


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
