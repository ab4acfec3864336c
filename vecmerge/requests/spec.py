"""One declaration per option: a request's field says its flag, help, type, default and check.

Each command's inputs are one frozen dataclass (a ``Request``) whose fields are made by ``option`` or
``argument``; ``cli/generated.py`` turns the fields into click parameters, and ``Request.from_flags``
turns what was typed into the request, every problem reported at once (one ``UsageError``). The same
checks run when code builds a request (``demo/``, tests), and when a YAML file gives it
(``Request.from_mapping``, ``from_file``: the keys are the flags' words, read through the same parse and
check; a request with a ``kind="recipe"`` field takes ``--recipe FILE`` for it). No click and no torch here.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from ..errors import UsageError, few
from ..io.parse import YAML_MAX_BYTES, ParseError, Written, decode_utf8, parse_yaml, read_bytes, safe_path, short
from ..recipe.mergekit_vocab import did_you_mean

Check = Callable[[Any], "str | None"]
R = TypeVar("R", bound="Request")


class Problem(ValueError):
    """What ``Spec.parse`` raises for text it cannot read: the whole message, flag named."""


@dataclass(frozen=True)
class Spec:
    """How one request field is typed on the command line.

    Args:
        flag (str | None): ``--name`` (``--x/--y`` for a pair of flags); None for an argument.
        help (str): the ``--help`` text. kind (str): text | float | int | path | choice | flag | pair | written
            | recipe (a YAML file of the other fields: ``Request.from_file``).
        choices (tuple[str, ...]): kind choice. default (Any): the value when not given (shown when ``shown``).
        required (bool): must be given. multiple (bool): repeatable (a tuple). metavar (str | None).
        nargs (int): an argument's count (-1: any number). path (dict): ``click.Path``'s keywords (kind path).
        range (tuple[int, int] | None): kind int: the inclusive range click enforces.
        parse (Callable[[Any], Any] | None): the typed value from the text given (raises ``Problem``).
        check (Callable[[Any], str | None] | None): the problem with a value, or None.
        files (bool): ``NAME=FILE`` entries: in a recipe file, each FILE starts from the file's folder (as a
            kind path does). in_file (bool): a recipe file may give it (False: the command line only, --force).
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
    files: bool = False
    in_file: bool = True

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
class RecipeFile:
    """The YAML file a request was read from (``--recipe``): its path and sha256, the keys it gave (as written)
    and those that flags typed beside it replaced."""

    path: str
    sha256: str
    keys: tuple[str, ...] = ()
    overridden: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        """``{"path", "sha256", "keys", "overridden"}``, for a record (search.json)."""
        return {"path": self.path, "sha256": self.sha256, "keys": list(self.keys), "overridden": list(self.overridden)}


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
    def from_flags(cls: type[R], given: Mapping[str, Any], typed: Collection[str] | None = None) -> R:
        """The request of the values click parsed; UsageError with every problem when a value cannot be read or
        checked. With a ``kind="recipe"`` field given (``--recipe FILE``): the file's keys (``from_file``), each
        flag typed beside it replacing the file's key.

        Args:
            given (Mapping[str, Any]): field name -> value as click parsed it (defaults included).
            typed (Collection[str] | None): the fields typed on the command line (None: those not at their default).
        """
        file = next((f for f in dataclasses.fields(cls) if spec_of(f).kind == "recipe"), None)
        if file is not None and given.get(file.name) is not None:
            beside = {f.name: given[f.name] for f in dataclasses.fields(cls) if f.name in given and f is not file
                      and (f.name in typed if typed is not None else given[f.name] != f.default)}
            return cls.from_file(given[file.name], flags=beside)
        values, problems = _read_flags(cls, given)
        if problems:
            more = [p for f in dataclasses.fields(cls) if f.name in values and (p := _checked(f, values[f.name]))]
            raise UsageError("; ".join(problems + more))
        return cls(**values)

    @classmethod
    def from_file(cls: type[R], path: str | Path, flags: Mapping[str, Any] | None = None) -> R:
        """The request a YAML file gives (``from_mapping``; its relative paths start from its folder), read
        bounded and strict (``io.parse``: no aliases, no key twice); a ``kind="recipe"`` field records it.

        Args:
            path (str | Path): the file. flags (Mapping[str, Any] | None): field -> value as click parsed it,
                typed beside the file: each replaces the file's key.
        """
        raw = read_bytes(path, max_bytes=YAML_MAX_BYTES)  # ParseError: one line naming the file
        data = parse_yaml(decode_utf8(raw, path), path)
        return cls.from_mapping(data, str(path), root=Path(path).parent, flags=flags,
                                file=RecipeFile(str(path), hashlib.sha256(raw).hexdigest()))

    @classmethod
    def from_mapping(cls: type[R], data: Any, source: str, *, root: str | Path | None = None,
                     flags: Mapping[str, Any] | None = None, file: RecipeFile | None = None) -> R:
        """The request a mapping gives (a YAML file's data), read through the flags' own ``parse`` and ``check``.

        A key is a flag's word (``--trust-max``: ``trust_max``, ``-`` or ``_``) or the field's name (``dirs``);
        a value is what the flag's text says, typed: a number, true/false, a string, a list for a repeatable
        flag (or a comma list), ``{NAME: value}`` for ``NAME=VALUE`` entries. Every problem at once:
        UsageError ``SOURCE: problem; problem``, each naming its key (an unknown one with a did-you-mean).

        Args:
            data (Any): the mapping. source (str): where it came from, for messages.
            root (str | Path | None): where relative paths start (kind path, ``files``); None: as written.
            flags (Mapping[str, Any] | None): field -> value as click parsed it: each replaces the file's key.
            file (RecipeFile | None): the file, kept in the ``kind="recipe"`` field (with the keys replaced).
        """
        fields = dataclasses.fields(cls)
        known = [key_of(f) for f in fields if spec_of(f).in_file]
        if not isinstance(data, Mapping):
            raise UsageError(f"{source}: expected a mapping of keys ({', '.join(known[:3])}, ...), got {short(data)}")
        words = {f.name: f for f in fields} | {key_of(f): f for f in fields}
        values: dict[str, Any] = {}
        problems: list[str] = []
        came: dict[str, str] = {}
        for k, v in data.items():
            f = words.get(k.replace("-", "_")) if isinstance(k, str) else None
            if f is None:
                hint = did_you_mean(k, known) or f" (the keys: {few(known, 8)})"
                problems.append(f"unknown key {short(k)}{hint}")
            elif not spec_of(f).in_file:
                problems.append(f"{k}: give {(spec_of(f).flag or k).split('/')[0]} on the command line, not in a file")
            elif f.name in came:
                problems.append(f"{k}: given twice (also as {came[f.name]}), keep one")
            else:
                came[f.name] = k
                try:
                    values[f.name] = _from_file(spec_of(f), v, k, None if root is None else Path(root))
                    problem = _checked(f, values[f.name])
                except Problem as e:
                    problem = str(e)
                if problem:
                    problems.append(_in_words(problem, spec_of(f), k))
        typed, more = _read_flags(cls, flags or {}, only_given=True)
        values.update(typed)
        problems += more + [p for f in fields if f.name in typed and (p := _checked(f, typed[f.name]))]
        for f in fields:  # a required field not given, or given empty (one the file gave unread is reported)
            s = spec_of(f)
            if s.required and (f.name in values or f.name not in came) and values.get(f.name) in (None, ()):
                problems.append(f"no {key_of(f)}: give {key_of(f)}: in the file" + (f" or {s.flag}" if s.flag else ""))
        if problems:
            raise UsageError(f"{source}: " + "; ".join(problems))
        into = next((f.name for f in fields if spec_of(f).kind == "recipe"), None)
        if file is not None and into is not None:
            values[into] = dataclasses.replace(file, keys=tuple(came.values()),
                                               overridden=tuple(came[n] for n in typed if n in came))
        try:
            return cls(**values)
        except UsageError as e:  # the checks across fields
            raise UsageError(f"{source}: {e}") from None


def key_of(f: dataclasses.Field) -> str:
    """The key a file gives a field by: its flag's word (``--trust-max``: ``trust_max``), else the field's name."""
    s = spec_of(f)
    return s.flag.split("/")[0].lstrip("-").replace("-", "_") if s.flag else f.name


def _read_flags(cls: type[Request], given: Mapping[str, Any], only_given: bool = False) -> tuple[dict, list[str]]:
    """The fields' values of what click parsed (each through its ``parse``), and the problems."""
    values, problems = {}, []
    for f in dataclasses.fields(cls):
        if only_given and f.name not in given:
            continue
        s, raw = spec_of(f), given.get(f.name)
        try:
            values[f.name] = s.parse(raw) if s.parse is not None and raw is not None else raw
        except Problem as e:
            problems.append(str(e))
    return values, problems


def _in_words(problem: str, s: Spec, key: str) -> str:
    """A problem of a value a file gave, led by its key, not the flag (``--budget 0: ...``: ``budget 0: ...``)."""
    flag = (s.flag or "").split("/")[0]
    return key + problem[len(flag):] if flag and problem.startswith(flag) else problem


def _from_file(s: Spec, v: Any, key: str, root: Path | None) -> Any:
    """The value of a field typed by ``s`` that a file gives as ``v``: typed as the flag's, then its ``parse``."""
    if s.kind in ("flag", "pair"):
        if not isinstance(v, bool):
            raise Problem(f"{key}: expected true or false, got {short(v)}")
        return v
    if not (s.multiple or s.nargs == -1):
        if isinstance(v, list) and s.parse is not None:  # a comma list, as the flag takes it
            v = ",".join(_text(x, key) for x in v)
        value = _scalar(s, v, key, root)
        return s.parse(value) if s.parse is not None else value
    if isinstance(v, Mapping):
        items: list = [f"{_text(n, key)}={_text(x, key)}" for n, x in v.items()]
    else:
        items = list(v) if isinstance(v, list) else [v]
    if s.files:
        items = [_entry_file(_text(x, key), key, root) for x in items]
    if s.parse is not None:
        return s.parse(tuple(_text(x, key) for x in items))
    return tuple(_scalar(s, x, key, root) for x in items)


def _scalar(s: Spec, v: Any, key: str, root: Path | None) -> Any:
    """One value of kind ``s.kind``: an int, a number, one of the choices, a path from ``root``, or text."""
    if s.kind == "int":
        if isinstance(v, bool) or not isinstance(v, int):
            raise Problem(f"{key}: expected an integer, got {short(v)}")
        if s.range is not None and not s.range[0] <= v <= s.range[1]:
            raise Problem(f"{key} {v}: between {s.range[0]} and {s.range[1]}")
        return v
    if s.kind in ("float", "written"):
        if s.kind == "written" and isinstance(v, str):
            try:
                return Written(v)
            except ValueError:
                pass
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise Problem(f"{key}: expected a number, got {short(v)}")
        return Written(str(v), float(v)) if s.kind == "written" else float(v)
    if s.kind == "choice":
        if v not in s.choices:
            raise Problem(f"{key} {short(v)}: one of {', '.join(s.choices)}{did_you_mean(v, s.choices)}")
        return v
    text = _text(v, key)
    return _path(text, key, root) if s.kind in ("path", "recipe") else text


def _text(v: Any, key: str) -> str:
    """A scalar as the flag's text (a string as it is, a number written out); a Problem for anything else."""
    if isinstance(v, str):
        return v
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return str(v)
    raise Problem(f"{key}: expected a string or a number, got {short(v)}")


def _path(text: str, key: str, root: Path | None) -> str:
    """``text`` as a path from ``root`` (an absolute one as it is); a Problem for an empty one or a control char."""
    try:
        p = safe_path(text, field=key, source="")
    except ParseError as e:
        raise Problem(e.problem) from None
    return str(p if root is None or p.is_absolute() else root / p)


def _entry_file(text: str, key: str, root: Path | None) -> str:
    """``NAME=FILE`` with FILE from ``root`` (text without ``=`` is left for the parse to refuse)."""
    name, eq, rest = text.partition("=")
    return f"{name}={_path(rest.strip(), key, root)}" if eq and rest.strip() else text


def _checked(f: dataclasses.Field, value: Any) -> str | None:
    s = spec_of(f)
    return s.check(value) if s.check is not None and value is not None and value != () else None


def positive(flag: str, what: str) -> Check:
    """A check: a finite number > 0, else ``FLAG VALUE: WHAT``."""
    return lambda v: None if math.isfinite(v) and v > 0 else f"{flag} {v}: {what}"


def at_least(flag: str, low: int, what: str) -> Check:
    """A check: an integer >= ``low``, else ``FLAG VALUE: WHAT``."""
    return lambda v: None if v >= low else f"{flag} {v}: {what}"
