"""Pair records: a measurement of two models together on one item (a probe's KL and JS divergences).

A record of one model (``records.Entry``) cannot hold a number that belongs to two: ``KL(a || b)`` on an item
is tied to *both* adapters' content sha256. Pair records live in their own table of the ledger file,
``pair_records`` (created on the first pair written, so ledgers without pairs are unchanged and older vecmerge
versions read the file as before), and are written in the same transaction as the entries they go with
(``write``). Like every record they follow the weights: a reader asks by the sha256s it holds now.

    row (metric, item, model_a, sha_a, model_b, sha_b, value, source)   e.g. (probe:toy:kl, q1, v51, .., v28, .., 0.12)
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass

from .. import EvidenceError
from .ledger import Entry, Ledger
from .records import SHA_RE, finite_number, name_problem

_TABLE = """CREATE TABLE IF NOT EXISTS pair_records (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    metric TEXT NOT NULL,
    item TEXT NOT NULL,
    model_a TEXT NOT NULL,
    sha_a TEXT,
    model_b TEXT NOT NULL,
    sha_b TEXT,
    value REAL NOT NULL,
    source TEXT NOT NULL,
    created TEXT NOT NULL
)"""
_INDEX = "CREATE INDEX IF NOT EXISTS pair_records_metric_source ON pair_records (metric, source)"
_COLUMNS = "metric, item, model_a, sha_a, model_b, sha_b, value, source"


@dataclass(frozen=True)
class PairEntry:
    """One number of models a and b on one item (order matters: ``KL(a || b)`` is not ``KL(b || a)``).

    Args:
        metric (str): e.g. ``probe:toy:kl``. item (str): the item id. model_a, model_b (str): names.
        sha_a, sha_b (str | None): their content sha256 when measured. value (float): finite.
        source (str): where it came from (a probe: ``probe:<prompt file>@<its sha256>``).
    """

    metric: str
    item: str
    model_a: str
    sha_a: str | None
    model_b: str
    sha_b: str | None
    value: float
    source: str

    def problems(self) -> list[str]:
        """Every problem with this entry (empty when it can be recorded)."""
        out = [p for p in (name_problem(self.metric, "metric"), name_problem(self.item, "item"),
                           name_problem(self.model_a, "model_a"), name_problem(self.model_b, "model_b"),
                           name_problem(self.source, "source")) if p]
        out += [f"{k}: {v!r} is not 64 lowercase hex digits" for k, v in (("sha_a", self.sha_a), ("sha_b", self.sha_b))
                if v is not None and not (isinstance(v, str) and SHA_RE.match(v))]
        try:
            finite_number(self.value, "value")
        except EvidenceError as err:
            out.append(str(err))
        return out

    def to_dict(self) -> dict:
        return asdict(self)


def write(ledger: Ledger, entries: Iterable[Entry], pairs: Iterable[PairEntry],
          directions: Mapping[str, bool] | None = None) -> tuple[list[int], int]:
    """Record ``entries`` (``Ledger.write``) and ``pairs`` in ONE transaction, or nothing at all.

    Returns:
        (the entries' new ids, the number of pair records written).
    """
    pairs = list(pairs)
    problems = [f"pair {i + 1} ({p.model_a!r}, {p.model_b!r}, {p.metric!r}): {q}"
                for i, p in enumerate(pairs) for q in p.problems()]
    if problems:
        raise EvidenceError(f"nothing recorded: {len(problems)} problem(s): {'; '.join(problems[:3])}")

    def insert(con: sqlite3.Connection, now: str) -> None:
        if pairs:
            con.execute(_TABLE)
            con.execute(_INDEX)
            con.executemany(f"INSERT INTO pair_records ({_COLUMNS}, created) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                            [(p.metric, p.item, p.model_a, p.sha_a, p.model_b, p.sha_b, float(p.value), p.source, now)
                             for p in pairs])

    return ledger.write(entries, directions, also=insert), len(pairs)


def records(ledger: Ledger, metrics: Iterable[str], source: str | None = None) -> list[PairEntry]:
    """Pair records of ``metrics`` (and of ``source`` when given), in the order written; none without the table."""
    metrics = list(metrics)
    found = ledger._read("SELECT name FROM sqlite_master WHERE type = 'table' AND name = 'pair_records'")
    if not found or not metrics:
        return []
    sql = f"SELECT {_COLUMNS} FROM pair_records WHERE metric IN ({', '.join('?' * len(metrics))})"
    args = list(metrics)
    if source is not None:
        sql += " AND source = ?"
        args.append(source)
    return [PairEntry(*row) for row in ledger._read(sql + " ORDER BY id", args)]
