"""The ledger's file as SQLite sees it: whether a write may open it, its journal mode, what a failed write means.

``damaged`` reads the 100-byte header before SQLite opens the file (a truncated or foreign file is refused before
any byte of it changes); ``use_wal`` switches a ledger to WAL; ``failed_write`` turns SQLite's error into the
words a user needs (a full disk).
"""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path

from ...io.files import open_regular

SQLITE_FULL = 13  # SQLite's result code for a full disk (``sqlite3.SQLITE_FULL`` from Python 3.11 only)


def damaged(path: Path) -> str | None:
    """Why the file cannot be a whole SQLite database, from its 100-byte header (None when it may be one):
    not SQLite's magic string, or shorter than the pages the header counts (a truncated copy). An empty
    file is a new database; with a write-ahead log waiting, the header's count is not checked."""
    try:
        with open_regular(path) as f:  # a FIFO or device is refused, never opened (nor by SQLite)
            size = os.fstat(f.fileno()).st_size
            head = f.read(100)
    except FileNotFoundError:
        return None
    except OSError as err:
        return f"cannot read it ({err.strerror or err})"
    if size == 0:
        return None
    if len(head) < 100 or not head.startswith(b"SQLite format 3\x00"):
        return "not an SQLite database (its first bytes are not SQLite's header)"
    page = int.from_bytes(head[16:18], "big")
    page = 65536 if page == 1 else page
    pages, counter, valid_for = (int.from_bytes(head[i:i + 4], "big") for i in (28, 24, 92))
    wal = path.with_name(path.name + "-wal")
    if counter == valid_for and pages and size < pages * page and not (wal.exists() and wal.stat().st_size):
        return f"truncated: {size} bytes, its header counts {pages} pages of {page} bytes"
    return None


def failed_write(err: sqlite3.Error) -> str:
    """What a failed write's error means for the user: a full disk (SQLITE_FULL), said in words."""
    code = getattr(err, "sqlite_errorcode", None)
    if code == SQLITE_FULL or "disk is full" in str(err):
        return ": the disk is full; free space there and run it again (nothing was recorded)"
    return ""


def use_wal(con: sqlite3.Connection, timeout: float) -> None:
    """Switch the connection's database to WAL (once per file). SQLite answers "locked" at once, without its
    busy handler, when two processes switch a new file together, so this retries for ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if con.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
                con.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as err:
            if "locked" not in str(err) or time.monotonic() > deadline:
                raise
            time.sleep(0.005)
