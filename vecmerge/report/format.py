"""The primitives every report shares: a table, JSON, a number in few digits.

``table`` is where names and paths taken from the user or from files (an adapter folder, a module, a metric)
reach a terminal: every text cell and header goes through ``io.safe_text.printable`` before tabulate measures
the columns, so an escape sequence is neither sent nor counted in a width. JSON needs nothing: it escapes every
control character itself. The CLI's ``echo`` strips what the lines around the tables hold (``cli.app.echo``).
Columns align by display width (``display_width``: a CJK character takes two columns), not by code points."""

from __future__ import annotations

import json
import numbers
import unicodedata

import tabulate as _tabulate
from tabulate import tabulate

from ..io.safe_text import printable
from ..outputs.manifest import jsonable


def table(rows: list, headers: list, fmt: str = "simple") -> str:
    """A tabulate table (``simple``, ``github`` for markdown, ...); text cells and headers shown printable (a
    control character, line break included, or an escape sequence in a name is removed: module docstring)."""
    rows = [[_shown(c) for c in row] for row in rows]
    headers = [_shown(h) for h in headers]
    wide = any(isinstance(c, str) and display_width(c) != len(c) for c in [*headers, *(c for r in rows for c in r)])
    saved = (_tabulate.wcwidth, _tabulate.WIDE_CHARS_MODE)  # type: ignore[attr-defined]
    if wide:  # tabulate measures by wcwidth when it is there; give it display_width for this table only
        _tabulate.wcwidth, _tabulate.WIDE_CHARS_MODE = _Width, True  # type: ignore[attr-defined]
    try:
        if not any(headers):
            return tabulate(rows, tablefmt=fmt, disable_numparse=True)
        return tabulate(rows, headers=headers, tablefmt=fmt, floatfmt=".4g", disable_numparse=True)
    finally:
        _tabulate.wcwidth, _tabulate.WIDE_CHARS_MODE = saved  # type: ignore[attr-defined]


def display_width(text: str) -> int:
    """Columns ``text`` takes on a terminal: 2 per wide or fullwidth character (``unicodedata.east_asian_width``
    W or F: CJK), 0 per combining mark, 1 otherwise."""
    return sum(0 if unicodedata.combining(ch) else 2 if unicodedata.east_asian_width(ch) in "WF" else 1
               for ch in text)


class _Width:
    """The two functions tabulate asks of ``wcwidth``, by ``display_width``."""

    @staticmethod
    def wcswidth(text: str) -> int:
        return display_width(text)

    @staticmethod
    def wcwidth(ch: str) -> int:
        return display_width(ch)


def _shown(cell):
    """A cell as tabulate gets it: numbers and None as they are (tabulate formats them), anything else as
    printable text; a text cell keeps its line breaks (a renderer's wrapped detail), a Path or other object
    shows on one line."""
    if cell is None or isinstance(cell, numbers.Number):
        return cell
    return printable(cell, keep_newlines=isinstance(cell, str))


def to_json(obj) -> str:
    """JSON with Paths and other objects stringified; NaN written as null (``outputs.manifest.jsonable``)."""
    return json.dumps(jsonable(obj), indent=2, allow_nan=False)


def g(x, digits: int = 4) -> str:
    """A short number: 4 significant digits."""
    return "-" if x is None else f"{x:.{digits}g}"
