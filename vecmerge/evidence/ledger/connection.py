"""The ledger's SQLite file: connections, one-transaction writes and version-checked reads.

Every write is one transaction (``BEGIN IMMEDIATE`` on a WAL database with a busy timeout), so two
processes may write at once and neither loses a record. Before it writes, a write reads back every stored
row (``stored.check_rows``): a ledger changed outside vecmerge is refused naming the record, with nothing
written. A read opens the file read-only and reads an older schema as it is (``schema.py``).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

from .. import EvidenceError
from . import schema, sqlite_file, stored
from .schema import SCHEMA_VERSION

T = TypeVar("T")
Sql = str | Callable[[int], str | None] | None  # a query, or one per schema version (None: no rows)


class LedgerFile:
    """The SQLite file under a ``ledger.Ledger``: how it is opened, written in one transaction and read.

    Args:
        path (str | Path): the database file. timeout (float): seconds a writer waits for another's transaction.
    """

    def __init__(self, path: str | Path, timeout: float = 30.0):
        self.path = Path(path)
        self.timeout = timeout

    def __repr__(self) -> str:
        return f"Ledger({str(self.path)!r})"

    # -- connections -------------------------------------------------------------------------------
    def _connect(self, write: bool) -> sqlite3.Connection:
        """A connection: read-write for a write, else read-only (SQLite URI ``mode=ro``; ``immutable=1`` as well
        where the folder cannot be written, so a ledger on read-only media is read without locks or a -shm file).

        A write opens nothing but a ledger or an empty file: a foreign or damaged database is refused before any
        byte of it changes (a truncated one before SQLite opens it, ``sqlite_file.damaged``; a ledger whose rows
        are refused stays in its journal mode: WAL is switched on only after a write commits)."""
        if (why := sqlite_file.damaged(self.path)) is not None:
            raise EvidenceError(f"{self.path}: cannot open the evidence ledger: {why}; restore it from a copy (nothing "
                                "was changed)")
        try:
            if write:
                con = sqlite3.connect(self.path, timeout=self.timeout, isolation_level=None)
            else:
                con = sqlite3.connect(self._read_uri(), uri=True, timeout=self.timeout, isolation_level=None)
            con.execute(f"PRAGMA busy_timeout = {int(self.timeout * 1000)}")
            if write:  # only a ledger (or an empty database) is written; WAL is switched on after a commit
                names = {r[0] for r in con.execute("SELECT name FROM sqlite_master")}
                if names and "schema_version" not in names:
                    con.close()
                    raise self._not_a_ledger("no schema_version table")
        except sqlite3.Error as err:
            raise EvidenceError(f"{self.path}: cannot open the evidence ledger ({err})") from err
        return con

    def _read_uri(self) -> str:
        """``file:...?mode=ro``, plus ``&immutable=1`` when the folder is not writable and no write-ahead log
        is waiting (SQLite could not take a lock or make its -shm file there; nothing can be writing it).

        In a writable folder a read-only connection to a WAL ledger leaves SQLite's two companion files (an
        empty -wal and the -shm index) behind, since it may not checkpoint; the next write removes them."""
        path = self.path.resolve()
        wal = path.with_name(path.name + "-wal")
        immutable = not os.access(path.parent, os.W_OK) and not (wal.exists() and wal.stat().st_size > 0)
        return path.as_uri() + "?mode=ro" + ("&immutable=1" if immutable else "")

    def _not_a_ledger(self, why: object) -> EvidenceError:
        return EvidenceError(f"{self.path}: not a vecmerge evidence ledger ({why}); "
                             "point `evidence:` in vecmerge.yaml at another file")

    def _check_version(self, con: sqlite3.Connection) -> int:
        """The ledger's schema version (1..SCHEMA_VERSION); raises for a newer, missing or malformed one."""
        try:
            rows = con.execute("SELECT version FROM schema_version").fetchall()
        except sqlite3.DatabaseError as err:
            raise self._not_a_ledger(err) from None
        return stored.schema_version(rows, self.path, SCHEMA_VERSION)

    def _write(self, work: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``work(con)`` inside one BEGIN IMMEDIATE transaction (schema created on first use, an older
        ledger migrated to ``SCHEMA_VERSION`` in the same transaction: see ``schema.py``)."""
        con = self._connect(write=True)
        try:
            con.execute("BEGIN IMMEDIATE")
            try:
                if not schema.tables(con):  # a new file: create the ledger (never inside someone else's database)
                    schema.create(con)
                schema.migrate(con, self._check_version(con))
                schema.index(con)
                # every stored row checked before any write (a refusal's ROLLBACK undoes the migration too)
                stored.check_rows(con, self.path, schema.record_select(SCHEMA_VERSION), schema.PLAN_COLUMNS)
                out = work(con)
                con.execute("COMMIT")
            except BaseException:
                if con.in_transaction:  # SQLite may have rolled back itself (a full disk): keep the first error
                    with contextlib.suppress(sqlite3.Error):
                        con.execute("ROLLBACK")
                raise
            with contextlib.suppress(sqlite3.OperationalError):  # committed; a later write switches it if not now
                sqlite_file.use_wal(con, self.timeout)
            return out
        except sqlite3.Error as err:
            raise EvidenceError(f"{self.path}: could not write to the evidence ledger ({err})"
                                f"{sqlite_file.failed_write(err)}") from err
        finally:
            con.close()

    def _read(self, sql: Sql, args: Sequence = ()) -> list[tuple]:
        """Rows of ``sql`` (a string, or a function of the schema version giving one, or None: no rows)."""
        if not self.path.exists():
            return []
        con = self._connect(write=False)
        try:
            if not schema.tables(con):
                return []
            version = self._check_version(con)
            sql = sql(version) if callable(sql) else sql
            return [] if sql is None else con.execute(sql, args).fetchall()
        except sqlite3.Error as err:
            raise EvidenceError(f"{self.path}: could not read the evidence ledger ({err})") from err
        finally:
            con.close()
