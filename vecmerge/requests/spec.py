"""One declaration per option: a request's field says its flag, help, type, default and check.

Each command's inputs are one frozen dataclass (a ``Request``) whose fields are made by ``option`` or
``argument``; ``cli/generated.py`` turns the fields into click parameters, and ``Request.from_flags``
turns what was typed into the request, every problem reported at once (one ``UsageError``). The same
checks run when code builds a request (``demo/``, tests). No click and no torch here.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from ..errors import UsageError

Check = Callable[[Any], "str | None"]
R = TypeVar("R", bound="Request")


class Problem(ValueError):
    """What ``Spec.parse`` raises for text it cannot read: the whole message, flag named."""


@dataclass(frozen=True)
class Spec:
    """How one request field is typed on the command line.

    Args:
        flag (str | None): ``--name`` (``--x/--y`` for a pair of flags); None for an argument.
        help (str): the ``--help`` text. kind (str): text | float | int | path | choice | flag | pair | written.
        choices (tuple[str, ...]): kind choice. default (Any): the value when not given (shown when ``shown``).
        required (bool): must be given. multiple (bool): repeatable (a tuple). metavar (str | None).
        nargs (int): an argument's count (-1: any number). path (dict): ``click.Path``'s keywords (kind path).
        range (tuple[int, int] | None): kind int: the inclusive range click enforces.
        parse (Callable[[Any], Any] | None): the typed value from the text given (raises ``Problem``).
        check (Callable[[Any], str | None] | None): the problem with a value, or None.
    """

    flag: str | None = None
    help: str | None = None
    kind: str = "text"
    choices: tuple[str, ...] = ()
    default: Any = None
    shown: bool = False
    required: bool = False
    multiple: bool = False
    metavar: str | None = None
    nargs: int = 1
    path: Mapping[str, bool] = dataclasses.field(default_factory=dict)
    range: tuple[int, int] | None = None
    parse: Callable[[Any], Any] | None = None
    check: Check | None = None

    def with_help(self, help: str, **more: Any) -> Spec:
        """This declaration with another ``--help`` text (a shared option worded for one command)."""
        return dataclasses.replace(self, help=help, **more)


def option(spec: Spec, **more: Any) -> Any:
    """A request field typed by ``spec`` (``more`` replaces some of its parts: help, default, ...)."""
    spec = dataclasses.replace(spec, **more) if more else spec
    default = spec.default if not spec.multiple else ()
    if spec.kind == "flag":
        default = False if spec.default is None else spec.default
    return dataclasses.field(default=default, metadata={"spec": spec})


def argument(**spec: Any) -> Any:
    """A positional request field (``nargs=-1``: a tuple of any length; ``required``: at least one)."""
    s = Spec(**spec)
    if s.required:
        return dataclasses.field(metadata={"spec": s})
    return dataclasses.field(default=() if s.nargs == -1 else None, metadata={"spec": s})


def spec_of(f: dataclasses.Field) -> Spec:
    """The declaration a request field was made with (``option`` or ``argument``)."""
    return f.metadata["spec"]


@dataclass(frozen=True)
class Request:
    """A command's inputs: checked whole when made (``problems``), every problem in one ``UsageError``."""

    def __post_init__(self) -> None:
        problems = self.problems()
        if problems:
            raise UsageError("; ".join(problems))

    def problems(self) -> list[str]:
        """Each field's check, then the checks across fields (``relations``)."""
        out = [p for f in dataclasses.fields(self) if (p := _checked(f, getattr(self, f.name)))]
        return out + self.relations()

    def relations(self) -> list[str]:
        """Problems between fields (none by default)."""
        return []

    @classmethod
    def from_flags(cls: type[R], given: Mapping[str, Any]) -> R:
        """The request of the values click parsed (``given``: field name -> value); UsageError with every
        problem when a value cannot be read or checked."""
        values, problems = {}, []
        for f in dataclasses.fields(cls):
            s, raw = spec_of(f), given.get(f.name)
            try:
                values[f.name] = s.parse(raw) if s.parse is not None and raw is not None else raw
            except Problem as e:
                problems.append(str(e))
        if problems:
            more = [p for f in dataclasses.fields(cls) if f.name in values and (p := _checked(f, values[f.name]))]
            raise UsageError("; ".join(problems + more))
        return cls(**values)


def _checked(f: dataclasses.Field, value: Any) -> str | None:
    s = spec_of(f)
    return s.check(value) if s.check is not None and value is not None and value != () else None


def positive(flag: str, what: str) -> Check:
    """A check: a finite number > 0, else ``FLAG VALUE: WHAT``."""
    return lambda v: None if math.isfinite(v) and v > 0 else f"{flag} {v}: {what}"


def at_least(flag: str, low: int, what: str) -> Check:
    """A check: an integer >= ``low``, else ``FLAG VALUE: WHAT``."""
    return lambda v: None if v >= low else f"{flag} {v}: {what}"
