"""Click commands generated from requests (``vecmerge.requests``): options, checks and ``--help`` from one table.

``command(group, Request, name)`` turns each field's ``Spec`` into a click argument or option (in the
fields' order, the global options after them), the class's docstring into the command's help, and what
was typed into the request (``Request.from_flags``: every problem at once, one ``error:`` line, exit 2).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from typing import Any

import click

from ..requests.spec import Request, Spec, spec_of
from .app import Ctx, echo, global_options, handled

_TYPED, _ENV = click.core.ParameterSource.COMMANDLINE, click.core.ParameterSource.ENVIRONMENT


class _WrittenFloat(click.types.FloatParamType):
    """A float that keeps the text it was given as (``io.parse.Written``): its decimals are the precision."""

    def convert(self, value, param, ctx):
        from ..io.parse import Written

        x = super().convert(value, param, ctx)
        return Written(value, x) if isinstance(value, str) else x


class _OrInFile(click.Option):
    """A required option that a recipe file (``--recipe``, processed first: eager) may give instead: shown
    ``[required]``, missing only when no file is given (the request checks the file's keys)."""

    def __init__(self, *decls: Any, file_param: str, **attrs: Any):
        super().__init__(*decls, **attrs)
        self.file_param = file_param

    def process_value(self, ctx: click.Context, value: Any) -> Any:
        if not isinstance(ctx.params.get(self.file_param), str):  # no file (None, or click's UNSET)
            return super().process_value(ctx, value)
        optional = copy.copy(self)
        optional.required = False
        return click.Option.process_value(optional, ctx, value)


def _type(s: Spec) -> Any:
    """The click type of a declaration (None: click's default, text)."""
    if s.kind == "choice":
        return click.Choice(s.choices)
    if s.kind == "recipe":
        return click.Path(dir_okay=False)
    if s.kind == "path":
        return click.Path(exists=s.path.get("exists", False), file_okay=s.path.get("file_okay", True),
                          dir_okay=s.path.get("dir_okay", True))
    if s.kind == "int" and s.range is not None:
        return click.IntRange(*s.range)
    return {"float": float, "int": int, "written": _WrittenFloat()}.get(s.kind)


def param(name: str, s: Spec, file_param: str | None = None) -> Callable:
    """The click decorator of one request field: an argument (no flag) or an option (``file_param``: the
    request's recipe-file field, which may give a required option instead)."""
    typed = {"type": t} if (t := _type(s)) is not None else {}
    if s.flag is None:
        return click.argument(name, nargs=s.nargs, required=s.required, **typed)
    decls = [s.flag, name]
    if s.kind == "flag":
        return click.option(*decls, is_flag=True, help=s.help)
    more: dict[str, Any] = {"multiple": True} if s.multiple else {}
    if s.metavar:
        more["metavar"] = s.metavar
    if s.default is not None or s.kind == "pair":
        more["default"] = s.default
    if s.shown:
        more["show_default"] = True
    if s.kind == "recipe":
        more["is_eager"] = True
    elif s.required and file_param is not None:
        more.update(cls=_OrInFile, file_param=file_param)
    return click.option(*decls, required=s.required, help=s.help, **typed, **more)


def command(group: click.Group, request: type[Request], name: str | None = None, **settings: Any) -> Callable:
    """Register ``fn(obj, request)`` on ``group`` as a command whose parameters and help are ``request``'s.

    Args:
        group (click.Group): where it goes. request (type[Request]): its inputs. name (str | None): the
            command's name (default: the function's). settings: more ``click.command`` keywords.
    """
    def deco(fn: Callable[[Ctx, Any], Any]) -> click.Command:
        def run(obj: Ctx, **given: Any) -> Any:
            ctx = click.get_current_context()
            typed = [n for n in given if ctx.get_parameter_source(n) in (_TYPED, _ENV)]
            return fn(obj, request.from_flags(given, typed))

        run.__name__, run.__doc__ = fn.__name__, request.__doc__
        f: Any = global_options(click.pass_obj(handled(run)))
        file = next((x.name for x in dataclasses.fields(request) if spec_of(x).kind == "recipe"), None)
        for field in reversed(dataclasses.fields(request)):
            f = param(field.name, spec_of(field), file)(f)
        return group.command(name or fn.__name__, help=request.__doc__, **settings)(f)

    return deco


def relay(group: click.Group, request: type[Request], name: str, target: str, *, progress: bool = False,
          **settings: Any) -> click.Command:
    """Register a command that hands its request to ``commands.<target>(ws, request, echo=...)``.

    Args:
        group (click.Group): where it goes. request (type[Request]): its inputs. name (str): the command's name.
        target (str): the function of ``vecmerge.commands`` that does the work. progress (bool): pass the
            progress-bar wrapper too. settings: more ``click.command`` keywords.
    """
    def call(obj: Ctx, req: Any) -> None:
        from .. import commands

        more = {"progress": obj.bars()} if progress else {}
        getattr(commands, target)(obj.ws(), req, echo=echo, **more)

    call.__name__ = target
    return command(group, request, name, **settings)(call)
