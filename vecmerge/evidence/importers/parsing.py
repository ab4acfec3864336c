"""Shared by the importers: what a parse returns, and problems collected per file and raised as one line."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any  # parse_number reads JSON values: any type, float() refuses what is not a number

from ...io.parse import ECHO_CHARS, short
from .. import EvidenceError
from ..ledger.records import Entry


@dataclass
class Parsed:
    """What one or more files hold, ready for ``Ledger.write``.

    entries (list[Entry]): the records (sha256 filled only where the file carried it).
    directions (dict[str, bool]): metric -> higher_is_better declared by the files (lm-eval).
    files (list[str]): the files read, in order.
    groups (dict[str, list[str]]): lm-eval's ``group_subtasks`` (a results file's groups; empty otherwise).
    decimals (dict[tuple[str, str | None], int]): (metric, sub-score or None) -> the most decimals a value was
        written with in the files' text (``precision.py``).
    """

    entries: list[Entry] = field(default_factory=list)
    directions: dict[str, bool] = field(default_factory=dict)
    files: list[str] = field(default_factory=list)
    groups: dict = field(default_factory=dict)
    decimals: dict = field(default_factory=dict)


MESSAGE_CHARS = 300


class Problems:
    """Collects (where, field, message) for one file and raises them as one line, bounded: each value a message
    echoes is shortened where it is named (``io.parse.short``), and a field name or message still longer than
    ``MESSAGE_CHARS`` is cut here, so a hostile file never makes the line as long as itself."""

    def __init__(self, path: Path):
        self.path = path
        self.items: list[tuple[str, str | None, str]] = []  # (where, field, message)

    def add(self, where: str, field_name: str | None, message: str) -> None:
        if len(message) > MESSAGE_CHARS:
            message = message[:MESSAGE_CHARS] + f"... ({len(message)} chars)"
        self.items.append((where, None if field_name is None else _bounded(field_name), message))

    def raise_if_any(self) -> None:
        if not self.items:
            return
        where, name, message = self.items[0]
        head = f"{self.path}: {where}" + (f", field '{name}'" if name else "") + f": {message}"
        if len(self.items) > 1:
            rest = [w + (f" '{f}'" if f else "") for w, f, _ in self.items[1:4]]
            more = len(self.items) - 1
            head += f" (and {more} more problem{'s' * (more > 1)}: {', '.join(rest)}{', ...' * (more > 3)})"
        raise EvidenceError(head + "; nothing was recorded")


def _bounded(name: str) -> str:
    """A field name as a message shows it: at most ``io.parse.ECHO_CHARS`` characters."""
    return name if len(name) <= ECHO_CHARS else f"{name[:ECHO_CHARS]}... ({len(name)} chars)"


def parse_number(text: Any, problems: Problems, where: str, name: str, *, allow_bool: bool = False) -> float | None:
    """A finite float from a cell or JSON value, or None after noting the problem."""
    if allow_bool and isinstance(text, bool):
        return float(text)
    if isinstance(text, bool) or text is None or isinstance(text, (list, dict)):
        problems.add(where, name, f"{short(text)} is not a number")
        return None
    try:
        value = float(text)
    except (TypeError, ValueError):
        problems.add(where, name, f"{short(text)} is not a number")
        return None
    if not math.isfinite(value):
        problems.add(where, name, f"{short(text)} is not finite (NaN and infinities cannot be recorded)")
        return None
    return value


def plain(text: str, problems: Problems, where: str, name: str, required: bool) -> str | None:
    text = text.strip()
    if not text:
        if required:
            problems.add(where, name, "empty")
        return None
    return text
