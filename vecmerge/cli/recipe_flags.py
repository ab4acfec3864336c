"""Flags that build a Recipe: the options of ``project``, ``merge``, ``refactor`` and ``run``, generated.

Every recipe key's flag, type, default and help come from the table of keys (``recipe/keys.py``), a
method's own options from the method registry (``methods.Field``), so nothing is spelled twice. A recipe
problem names its keys (``errors.Problem``), and is printed with the flags of the command that was typed.
"""

from __future__ import annotations

import dataclasses

import click
from click import ParameterSource

from .. import methods
from ..recipe.keys import KEYS, Key, offered, words
from ..requests import RunFlags
from ..requests.spec import spec_of
from .app import Ctx, echo, global_options
from .generated import param

_TYPES = {"number": float, "folder": click.Path(file_okay=False), "model_folder": click.Path(file_okay=False)}


def recipe_options(command: str):
    """Click options for the recipe keys ``command`` sets by flag (``keys.offered``), in the table's order.

    A flag not given is left out of the recipe (``recipe_data``): its default, shown in ``--help``, is the
    recipe's own.

    Args:
        command (str): project | merge | refactor | run.
    """
    flags = flag_words(command)

    def option(key: Key):
        text = key.describe(command, flags)
        if command == "run":
            text = f"Override the recipe's {key.name}. {text}"
        if key.kind in ("flag", "gate"):
            return click.option(str(key.flag), key.param, is_flag=True, help=text)
        if key.kind == "prompt_sets":  # repeatable NAME=PROMPTS
            return click.option(str(key.flag), key.param, multiple=True, metavar="NAME=PROMPTS", help=text)
        kind = click.Choice(key.allowed()) if key.allowed() else _TYPES.get(key.kind, str)
        shown = {} if key.default is None else {"default": key.default, "show_default": True}
        return click.option(str(key.flag), key.param, type=kind, required=key.required, help=text, **shown)

    def deco(fn):
        for key in reversed(offered(command)):
            fn = option(key)(fn)
        return fn

    return deco


def method_options(stepped: bool):
    """Click options for the fields of every registered method of this kind (generated, not typed twice)."""
    def deco(fn):
        for f, owners in reversed(list(_fields(stepped).values())):
            if f.kind == "bool":  # --x/--no-x: unset (None) unless given, so the method's default applies
                fn = click.option(f"{f.flag}/--no-{f.flag[2:]}", f.name, default=None,
                                  help=f"{f.help} ({', '.join(owners)}).")(fn)
                continue
            kind = click.Choice(f.choices) if f.choices else {"float": float, "int": int, "str": str}.get(f.kind)
            fn = click.option(f.flag, f.name, type=kind, default=None, help=f"{f.help} ({', '.join(owners)}).")(fn)
        return fn

    return deco


def run_options(force_help: str = "Replace an existing --out."):
    """What a run does besides its recipe (``requests.RunFlags``: --force, --dry-run, --json, --modules), and
    the global options."""
    def deco(fn):
        fn = global_options(fn)  # listed last in --help
        for f in reversed(dataclasses.fields(RunFlags)):
            s = spec_of(f)
            fn = param(f.name, s.with_help(force_help) if f.name == "force" else s)(fn)
        return fn

    return deco


def run_flags(given: dict) -> RunFlags:
    """The run's own flags, taken out of a command's keyword arguments (the rest are recipe keys)."""
    return RunFlags.from_flags({f.name: given.pop(f.name) for f in dataclasses.fields(RunFlags)})


def _fields(stepped: bool) -> dict:
    """``{field name: (Field, [method names])}`` over the registered methods of this kind."""
    seen: dict = {}
    for m in methods.names(stepped=stepped):
        for f in methods.get(m).fields:
            seen.setdefault(f.name, (f, []))[1].append(m)
    return seen


def flag_words(command: str) -> dict[str, str]:
    """``{recipe key: flag}`` of ``command``: the table's flags and its methods' fields (``--density``)."""
    out = words(command)
    if command in ("project", "merge"):
        out.update({name: f.flag for name, (f, _) in _fields(command == "project").items()})
    return out


def recipe_data(given: dict) -> dict:
    """The recipe that a command's flags give: each key under its name, those not given left out.

    ``--consensus-ref`` makes the ``consensus`` mapping (with ``--on-disagree`` and ``--min-agree``; without
    it they are not used); ``--gate`` is ``gate: true``, or ``{metric: ...}`` with ``--metric``.

    Args:
        given (dict): the command's keyword arguments: table keys by ``Key.param``, method fields by name.
    """
    ctx = click.get_current_context(silent=True)
    typed = {k: v for k, v in given.items()
             if v is not None and not (ctx and ctx.get_parameter_source(k) is ParameterSource.DEFAULT)}
    values = dict(typed)
    data = {}
    for key in KEYS:
        v = values.pop(key.param, None)
        if v is not None and v is not False and v != () and "." not in key.name:
            data[key.name] = v
    if typed.get("consensus_ref"):
        data["consensus"] = {k: typed[f"consensus_{k}"] for k in ("ref", "on_disagree", "min_agree")
                             if f"consensus_{k}" in typed}
    if data.get("gate") and typed.get("gate_metric"):
        data["gate"] = {"metric": typed["gate_metric"]}
    return {**data, **values}


def run_recipe(obj: Ctx, data: dict, command: str, flags: RunFlags, *, source="options", named=None):
    """Build the Recipe of ``data`` and run it; a recipe problem is worded with ``command``'s flags.

    Args:
        data (dict): the recipe (``recipe_data``). command (str): project | merge | refactor.
        named (dict | None): more words of this command, e.g. ``{"base": "EXPRESSION"}`` (an argument).
    """
    from .. import commands
    from ..errors import RecipeError
    from ..recipe.recipe import Recipe

    try:
        recipe = Recipe.from_dict(data, source)
        commands.merge(obj.ws(), recipe, flags, echo=echo, progress=obj.bars())
    except RecipeError as e:
        if e.source not in (source, "recipe"):
            raise
        raise e.worded({**flag_words(command), **(named or {})}, source) from None


CONFIG_FLAGS = ("rank", "out", "dtype", "allow_missing", "modules_to_save", "strict", "only", "exclude",
                "allow_base_mismatch", "base_model_id", "base_model", "seed", "space")  # what --config leaves to flags


def run_mergekit(obj: Ctx, path, data: dict, flags: RunFlags, *, typed=()):
    """``vecmerge merge --config FILE``: the mergekit configuration as a recipe, the flags' keys over it.

    Args:
        path (str): the YAML. data (dict): the recipe keys the flags gave (``recipe_data``); only
            ``CONFIG_FLAGS`` may be among them (the merge itself is the file's).
        typed (Sequence[str]): other things typed that the file gives instead (INPUT, --weights).
    """
    from .. import commands
    from .app import usage

    words = flag_words("merge")
    clash = [*typed, *(words.get(k, f"--{k.replace('_', '-')}") for k in data if k not in CONFIG_FLAGS)]
    if clash:
        usage(f"merge --config: {', '.join(clash)} come from {path}; edit the file, or leave --config out")
    commands.merge_config(obj.ws(), path, data, flags, echo=echo, progress=obj.bars())
