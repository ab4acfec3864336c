"""Flags that build a Recipe: the options of ``project``, ``merge`` and ``refactor``, generated where they can be.

Choices and method options come from ``options`` and the method registry, so nothing is spelled twice; a
recipe problem is reworded with the flags the user typed.
"""

from __future__ import annotations

import re

import click

from .. import methods
from ..options import (
    ALLOW_BASE_MISMATCH_HELP,
    ALLOW_MISSING_HELP,
    BASE_MODEL_ID_HELP,
    DTYPE_HELP,
    DTYPE_NAMES,
    KEEP_BASE_HELP,
    MODULES_TO_SAVE,
    MODULES_TO_SAVE_HELP,
    RANK_HELP,
    STEP_RANK_HELP,
)
from .app import Ctx, echo, global_options


def merge_options(stepped: bool, rank_note: str | None = None):
    def deco(fn):
        rank = (click.option("--rank", default=None, help=RANK_HELP + ". " + rank_note) if rank_note else
                click.option("--rank", default="exact", show_default=True,
                             help=RANK_HELP + (STEP_RANK_HELP + KEEP_BASE_HELP if stepped else "") + "."))
        opts = [
            rank,
            click.option("--dtype", type=click.Choice(DTYPE_NAMES), default="fp32", show_default=True,
                         help=DTYPE_HELP),
            click.option("--out", type=click.Path(file_okay=False),
                         help="Output adapter folder (written whole or not at all)."),
            click.option("--force", is_flag=True, help="Replace an existing --out."),
            click.option("--allow-missing", is_flag=True, help=ALLOW_MISSING_HELP),
            click.option("--modules-to-save", type=click.Choice(MODULES_TO_SAVE), default="refuse", show_default=True,
                         help=MODULES_TO_SAVE_HELP),
            click.option("--allow-base-mismatch", is_flag=True, help=ALLOW_BASE_MISMATCH_HELP),
            click.option("--base-model-id", help=BASE_MODEL_ID_HELP),
            click.option("--base-model", "base_model", type=click.Path(file_okay=False),
                         help="A local base model folder (transformers, safetensors): DoRA inputs are read as their "
                              "effective update m * (W + sBA) / ||W + sBA|| - W against its weights (exact, float64; "
                              "needed for DoRA adapters, recorded in the manifest)."),
            click.option("--dry-run", is_flag=True, help="Print the plan and report; write nothing."),
            click.option("--json", "as_json", is_flag=True, help="Machine-readable report."),
            click.option("--modules", "show_modules", is_flag=True, help="Also print the per-module table."),
        ]
        for o in reversed(opts):
            fn = o(fn)
        return global_options(fn)

    return deco


def selection_options(fn):
    fn = click.option("--exclude", help="Leave out modules whose name matches this regular expression "
                      r"(re.search), e.g. 'layers\.0\.'.")(fn)
    return click.option("--only", help="Only modules whose name matches this regular expression (re.search), "
                        "e.g. 'mlp' or 'q_proj|v_proj'.")(fn)


def method_options(stepped: bool):
    """Click options for the fields of every registered method of this kind (generated, not typed twice)."""
    def deco(fn):
        seen = {}
        for m in methods.names(stepped=stepped):
            for f in methods.get(m).fields:
                seen.setdefault(f.name, (f, []))[1].append(m)
        for f, owners in reversed(list(seen.values())):
            kind = click.Choice(f.choices) if f.choices else {"float": float, "int": int, "str": str}.get(f.kind)
            if f.kind == "bool":  # --x/--no-x: unset (None) unless given, so a recipe default applies
                fn = click.option(f"{f.flag}/--no-{f.flag[2:]}", f.name, default=None,
                                  help=f"{f.help} ({', '.join(owners)}).")(fn)
                continue
            fn = click.option(f.flag, f.name, type=kind, default=None, help=f"{f.help} ({', '.join(owners)}).")(fn)
        return fn

    return deco


def method_help(stepped: bool) -> str:
    return "; ".join(f"{m}: {methods.get(m).summary}" for m in methods.names(stepped=stepped))


_RECIPE_KEY_OF = {"direction": "dir", "consensus_ref": "consensus.ref", "on_disagree": "consensus.on_disagree",
                  "min_agree": "consensus.min_agree"}


def _flag_names(command: click.Command) -> dict[str, str]:
    """``{recipe key: what the user typed}`` for a command whose flags build a recipe (``--consensus-ref``...)."""
    names = {}
    for prm in command.params:
        if isinstance(prm, click.Argument):
            names["base"] = prm.human_readable_name
        elif prm.expose_value and prm.name:
            names[_RECIPE_KEY_OF.get(prm.name, prm.name)] = max(prm.opts, key=len)
    if "mode" in names:
        names["method"] = names["mode"]
    return names


def as_flags(problem: str, names: dict[str, str]) -> str:
    """A recipe problem worded with the flags the user typed: ``mode=onto-ref: needs consensus.ref`` becomes
    ``--mode onto-ref: needs --consensus-ref``.

    Args:
        problem (str): one message naming recipe keys. names (dict[str, str]): recipe key -> flag (``_flag_names``).
    """
    for key in sorted(names, key=len, reverse=True):
        k = re.escape(key)
        problem = re.sub(rf"(?<![\w.-]){k}=", lambda _m, f=names[key]: f + " ", problem)
        problem = re.sub(rf"(?<![\w.-]){k}(?=:|\s\(|\s+or\b|$)", lambda _m, f=names[key]: f, problem)
    return re.sub(r"(--[\w-]+): (?=[\d'\"])", r"\1 ", problem)


def run_recipe(obj: Ctx, data: dict, *, force, dry_run, as_json, show_modules, source="options"):
    from .. import commands
    from ..errors import RecipeError
    from ..recipe.recipe import Recipe

    try:
        recipe = Recipe.from_dict({k: v for k, v in data.items() if v is not None}, source)
        commands.merge(obj.ws(), recipe, force=force, dry_run=dry_run, as_json=as_json, show_modules=show_modules,
                       echo=echo, progress=obj.bars())
    except RecipeError as e:
        if e.source not in (source, "recipe"):
            raise
        names = _flag_names(click.get_current_context().command)
        raise RecipeError([as_flags(q, names) for q in e.problems], source) from None


def run_mergekit(obj: Ctx, path, flags: dict, *, force, dry_run, as_json, show_modules):
    """``vecmerge merge --config FILE``: the mergekit configuration as a recipe, the flags' keys over it."""
    from .. import commands

    commands.merge_config(obj.ws(), path, {k: v for k, v in flags.items() if v is not None}, force=force,
                          dry_run=dry_run, as_json=as_json, show_modules=show_modules, echo=echo,
                          progress=obj.bars())
