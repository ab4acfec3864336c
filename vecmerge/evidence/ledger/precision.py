"""The precision a score was written with: decimals read from the input's text, never from a float's repr.

``0.1480`` in a CSV cell has 4 decimals; the float 0.148 it becomes would say 3. So the importers count the
decimals of each number as written (CSV cell text, JSON number text), and ``--decimals N`` declares them. The
ledger keeps, per metric and sub-score, the most decimals any recorded value was written with (the finest
precision seen), in its own table ``precisions`` (created on the first write, so a ledger without it reads as
"precision unknown" and older vecmerge versions read the file as before):

    row (metric, sub, decimals)     sub '' for the metric's own value; decimals = max over every write
    precision                       10^-decimals; unknown (no row): ``grades.detect_grid`` reports no grade
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from typing import TYPE_CHECKING

from .. import EvidenceError

if TYPE_CHECKING:  # the ledger imports this module
    from .ledger import Ledger

_TABLE = """CREATE TABLE IF NOT EXISTS precisions (
    metric TEXT NOT NULL,
    sub TEXT NOT NULL,
    decimals INTEGER NOT NULL,
    PRIMARY KEY (metric, sub)
)"""
MAX_DECIMALS = 20

Key = tuple[str, "str | None"]


def decimals_of(text: str) -> int | None:
    """Decimals of a number as written: ``0.1480`` -> 4, ``1.5e-3`` -> 4, ``12`` -> 0; None for no number.

    Args:
        text (str): the number's text (a CSV cell, a JSON number).
    """
    try:
        exponent = Decimal(str(text).strip()).as_tuple().exponent
    except InvalidOperation:
        return None
    if not isinstance(exponent, int):  # NaN, Infinity
        return None
    return max(0, -exponent)


def check_decimals(value: object, what: str = "--decimals") -> int:
    """A declared number of decimals: a whole number 0..20, else EvidenceError naming ``what``."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_DECIMALS:
        raise EvidenceError(f"{what} {value!r}: give the decimals the scores are written with, a whole number "
                            f"from 0 to {MAX_DECIMALS}")
    return value


def note(found: dict, metric: str, sub: str | None, decimals: int | None) -> None:
    """Keep the most decimals seen for (metric, sub) in ``found``."""
    if decimals is not None:
        key = (metric, sub)
        found[key] = max(found.get(key, 0), decimals)


def write(con: sqlite3.Connection, decimals: Mapping[Key, int]) -> None:
    """Record ``decimals`` (keeping the larger of a stored and a new count) inside the caller's transaction."""
    if not decimals:
        return
    con.execute(_TABLE)
    for (metric, sub), n in decimals.items():
        con.execute("INSERT INTO precisions (metric, sub, decimals) VALUES (?, ?, ?) ON CONFLICT (metric, sub) DO "
                    "UPDATE SET decimals = max(decimals, excluded.decimals)", (metric, sub or "", int(n)))


def read(ledger: Ledger, metric: str | None = None) -> dict[Key, int]:
    """(metric, sub) -> decimals recorded (sub None for the metric's own value); empty without the table."""
    found = ledger._read("SELECT name FROM sqlite_master WHERE type = 'table' AND name = 'precisions'")
    if not found:
        return {}
    sql, args = "SELECT metric, sub, decimals FROM precisions", []
    if metric is not None:
        sql, args = sql + " WHERE metric = ?", [metric]
    return {(m, s or None): int(n) for m, s, n in ledger._read(sql, args)}


def of_metric(table: Mapping[Key, int], metric: str, declared: int | None = None) -> dict[str | None, int]:
    """sub (None: the value) -> decimals of ``metric``: ``declared`` for every one when given, else the table's."""
    mine = {s: n for (m, s), n in table.items() if m == metric}
    if declared is not None:
        return {s: declared for s in {None, *mine}} | {"*": declared}
    return mine
