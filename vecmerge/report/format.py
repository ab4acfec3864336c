"""The primitives every report shares: a table, JSON, a number in few digits."""

from __future__ import annotations

import json

from tabulate import tabulate

from ..outputs.manifest import jsonable


def table(rows: list, headers: list, fmt: str = "simple") -> str:
    """A tabulate table (``simple``, ``github`` for markdown, ...)."""
    if not any(headers):
        return tabulate(rows, tablefmt=fmt, disable_numparse=True)
    return tabulate(rows, headers=headers, tablefmt=fmt, floatfmt=".4g", disable_numparse=True)


def to_json(obj) -> str:
    """JSON with Paths and other objects stringified; NaN written as null (``outputs.manifest.jsonable``)."""
    return json.dumps(jsonable(obj), indent=2, allow_nan=False)


def g(x, digits: int = 4) -> str:
    """A short number: 4 significant digits."""
    return "-" if x is None else f"{x:.{digits}g}"
