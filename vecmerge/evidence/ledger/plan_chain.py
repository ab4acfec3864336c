"""The plans' integrity record: a sha256 chained over the plan rows, so a plan edited outside vecmerge is seen.

A plan is immutable (triggers refuse UPDATE and DELETE), but anyone may drop a trigger and edit the file with
SQL. Each plan row therefore stores

    chain_i = sha256(chain_{i-1} + "\\n" + JSON([id, a, b, ..., created, design]))     (chain_0 = "")

over its cells exactly as stored, in id order; reading any plan checks every link. An edited cell, a deleted
or renumbered plan before the last, or a forged row without the chain breaks a link: refused in one line
naming the plan. Plans recorded before schema 4 carry no chain (NULL) and may only come first. What it cannot
see: the last plan deleted, or a forger who recomputes the chain (it is a checksum, not a signature).
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from collections.abc import Sequence
from pathlib import Path

from .. import EvidenceError

_FIX = ("the plans were changed outside vecmerge (e.g. with SQL); restore the ledger from a copy (a plan is never "
        "edited: record a new one)")


def link(previous: str, cells: Sequence) -> str:
    """sha256(previous + "\\n" + JSON(cells)) as hex: one plan row's integrity record, its chain cell excluded.

    Args:
        previous (str): the chain of the plan before ("" for the first). cells (Sequence): the row as stored.
    """
    text = json.dumps(list(cells), ensure_ascii=True, separators=(",", ":"), default=repr)
    return hashlib.sha256(f"{previous}\n{text}".encode()).hexdigest()


FIRST_CHAINED = "SELECT first_id FROM plan_chain_start"  # the first plan id schema 4 chained (schema.py)


def first_chained(con: sqlite3.Connection) -> int | None:
    """The first plan id that must carry a chain (recorded when the ledger reached schema 4), or None."""
    try:
        row = con.execute(FIRST_CHAINED).fetchone()
    except Exception:  # a ledger without the record (older than it): only the order rule applies
        return None
    return row[0] if row and isinstance(row[0], int) and not isinstance(row[0], bool) else None


def check_chain(rows: Sequence[Sequence], path: Path, first: int | None = None) -> str:
    """Check every plan row's chain (its last cell), rows in id order; returns the last link ("" for none).

    Args:
        rows (Sequence[Sequence]): the plan rows, chain last. first (int | None): ``first_chained``: every plan
            from that id on must carry a chain (plans made before schema 4 may not).

    Raises:
        EvidenceError: the first plan whose chain is missing after a chained plan, or does not match.
    """
    previous, chained = "", False
    for row in rows:
        want, stored = link(previous, row[:-1]), row[-1]
        if stored is None and (chained or (first is not None and isinstance(row[0], int) and row[0] >= first)):
            raise EvidenceError(f"{path}: plan {row[0]!r} has no integrity record, which every plan since schema "
                                f"4 carries; {_FIX}")
        if stored is not None and stored != want:
            raise EvidenceError(f"{path}: plan {row[0]!r}: its integrity record does not match its cells or the "
                                f"plans before it; {_FIX}")
        chained = chained or stored is not None
        previous = want
    return previous
