"""The ledger's SQLite file: two writers lose nothing, reads open it read-only, a refused write changes no byte,
a full disk is said in words."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import time

import pytest

from vecmerge.evidence import EvidenceError
from vecmerge.evidence.ledger.ledger import Ledger


@pytest.fixture
def ledger(tmp_path) -> Ledger:
    return Ledger(tmp_path / "vecmerge-evidence.db")


WRITER = """
import sys, time
from pathlib import Path
from vecmerge.evidence.ledger.ledger import Ledger
db, name, n, go = sys.argv[1], sys.argv[2], int(sys.argv[3]), Path(sys.argv[4])
ledger = Ledger(db)
while not go.exists():
    time.sleep(0.002)
start = time.time()
for i in range(n):
    ledger.add(name, None, "m", float(i))
ledger.add(name, None, "batch", [float(i) for i in range(n)])
print(start, time.time())
"""


def test_two_concurrent_writer_processes_lose_no_record(tmp_path):
    """Both processes start writing at the same moment (a go file), one transaction per record, then one
    batch each; every record of both arrives, ids are unique, and the two writing windows overlapped."""
    db, go, n = tmp_path / "shared.db", tmp_path / "go", 100
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(db), name, str(n), str(go)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for name in ("p1", "p2")]
    time.sleep(0.3)  # both imported and waiting
    go.touch()
    windows = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        windows.append(tuple(map(float, out.split())))
    (s1, e1), (s2, e2) = windows
    assert s1 < e2 and s2 < e1, f"the writers did not run at the same time: {windows}"
    ledger = Ledger(db)
    recs = ledger.records()
    assert len(recs) == 4 * n
    assert len({r.id for r in recs}) == 4 * n
    for name in ("p1", "p2"):
        for metric in ("m", "batch"):
            assert sorted(r.value for r in recs if r.model == name and r.metric == metric) == list(map(float, range(n)))
    con = sqlite3.connect(db)
    assert con.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    con.close()


# -- read-only opens (issue 23): read-only commands on read-only media; refused writes change no byte --------------
def test_reads_open_the_ledger_read_only(ledger, monkeypatch):
    ledger.add("v51", None, "m", [1.0, 1.1])
    assert ledger._read_uri().endswith("?mode=ro")
    seen = []
    real = sqlite3.connect
    monkeypatch.setattr(sqlite3, "connect", lambda *a, **k: seen.append((a, k)) or real(*a, **k))
    ledger.records()
    ledger.directions()
    assert seen and all(k.get("uri") and a[0].startswith("file:") and "mode=ro" in a[0] for a, k in seen)
    con = real(ledger._read_uri(), uri=True)
    with pytest.raises(sqlite3.OperationalError, match="readonly"):
        con.execute("DELETE FROM records")
    con.close()


def test_a_ledger_in_a_folder_that_cannot_be_written_is_opened_immutable(ledger, monkeypatch):
    """Without write access to the folder SQLite can neither lock nor make its -shm file; immutable=1 reads
    without either (nothing can be writing there). os.access is made to say so, which works as root too."""
    import os

    ledger.add("v51", None, "m", [1.0, 1.1])
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if mode == os.W_OK else real(p, mode))
    assert ledger._read_uri().endswith("?mode=ro&immutable=1")
    before = sorted(p.name for p in ledger.path.parent.iterdir())
    assert [r.value for r in ledger.records()] == [1.0, 1.1]
    assert sorted(p.name for p in ledger.path.parent.iterdir()) == before  # no -wal, no -shm made


@pytest.mark.skipif(getattr(__import__("os"), "geteuid", lambda: 1)() == 0,
                    reason="root ignores a folder's permissions; the immutable test above covers the path")
def test_a_ledger_on_a_read_only_folder_can_be_read(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    ledger = Ledger(folder / "vecmerge-evidence.db")
    ledger.add("v51", None, "m", [1.0, 1.1])
    folder.chmod(0o555)
    try:
        assert [r.value for r in ledger.records()] == [1.0, 1.1] and ledger.models() == ["v51"]
        with pytest.raises(EvidenceError, match="could not write|cannot open"):
            ledger.add("v51", None, "m", 1.2)
    finally:
        folder.chmod(0o755)


def foreign_sqlite(path):
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE thesis (chapter TEXT)")
    con.execute("INSERT INTO thesis VALUES ('precious')")
    con.commit()
    con.close()


@pytest.mark.parametrize("kind", ["foreign", "truncated", "junk", "header only"])
def test_a_refused_write_leaves_a_foreign_or_damaged_database_byte_for_byte(tmp_path, kind):
    path = tmp_path / "vecmerge-evidence.db"
    if kind == "foreign":
        foreign_sqlite(path)
    else:
        Ledger(path).add("v51", None, "m", [float(i) for i in range(300)], note="x" * 200)
        data = path.read_bytes()
        path.write_bytes({"truncated": data[:len(data) // 2], "junk": b"\x00not sqlite" * 99,
                          "header only": data[:100]}[kind])
    before = path.read_bytes()
    names = sorted(p.name for p in tmp_path.iterdir())
    for action in (lambda: Ledger(path).add("v51", None, "m", 1.0), lambda: Ledger(path).set_direction("m", True),
                   lambda: Ledger(path).records()):
        with pytest.raises(EvidenceError, match=str(path)):
            action()
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == names


def _view_only(path):
    con = sqlite3.connect(path)
    con.execute("CREATE VIEW answer AS SELECT 42")
    con.commit()
    con.close()


def _cell_changed_rollback_journal(path):
    Ledger(path).add("v51", None, "m", [1.0, 2.0])
    con = sqlite3.connect(path)
    con.execute("PRAGMA journal_mode = DELETE")  # a copy made by a tool that leaves WAL
    con.execute("UPDATE records SET value = 'abc' WHERE id = 2")
    con.commit()
    con.close()


def _old_ledger_missing_a_table(path):
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
    con.execute("INSERT INTO schema_version VALUES (1)")
    con.execute("CREATE TABLE records (id INTEGER PRIMARY KEY, model TEXT)")
    con.commit()
    con.close()


@pytest.mark.parametrize("make", [_view_only, _cell_changed_rollback_journal, _old_ledger_missing_a_table])
def test_a_refused_add_does_not_modify_a_corrupt_or_foreign_sqlite_file(tmp_path, make):
    """Issue 36 item 10: a refused ``add`` switched the file to WAL (bytes 18-19 of its header) before refusing it,
    and a database holding only a view was taken for an empty one and made a ledger. Byte-compared before/after."""
    path = tmp_path / "ledger.db"
    make(path)
    before, names = path.read_bytes(), sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(EvidenceError, match=str(path)):
        Ledger(path).add("v51", None, "m", 1.0)
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == names


def test_a_new_ledger_is_switched_to_wal_after_its_first_write(ledger):
    ledger.add("v51", None, "m", 1.0)
    con = sqlite3.connect(ledger.path)
    assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    con.close()


class _FullDisk:
    """A connection whose first INSERT fails as SQLite does on a full disk: it rolls the transaction back itself
    (SQLITE_FULL), then raises; everything else goes to the real connection."""

    def __init__(self, con):
        self._con = con

    def execute(self, sql, *args):
        if sql.lstrip().startswith("INSERT"):
            self._con.execute("ROLLBACK")
            raise sqlite3.OperationalError("database or disk is full")
        return self._con.execute(sql, *args)

    def __getattr__(self, name):
        return getattr(self._con, name)


def test_a_full_disk_during_a_ledger_write_says_the_disk_is_full(ledger, monkeypatch):
    """Issue 36 item 10: the error was "cannot rollback - no transaction is active" (the ROLLBACK after SQLite's
    own), never that the disk is full. Now it names the full disk, and nothing is written."""
    ledger.add("v51", None, "m", [1.0, 2.0])
    before = ledger.export()
    real = Ledger._connect
    monkeypatch.setattr(Ledger, "_connect", lambda self, write: _FullDisk(real(self, write)) if write
                        else real(self, write))
    with pytest.raises(EvidenceError) as err:
        ledger.add("v51", None, "m", [3.0, 4.0])
    msg = str(err.value)
    assert "disk is full" in msg and "free space" in msg and "cannot rollback" not in msg and "\n" not in msg
    monkeypatch.undo()
    assert ledger.export() == before


def test_a_real_sqlite_full_error_is_said_and_writes_nothing(ledger, monkeypatch):
    """The same with SQLite's own SQLITE_FULL: ``max_page_count`` caps the file at its current size."""
    ledger.add("v51", None, "m", [1.0, 2.0])
    before = ledger.export()
    real = Ledger._connect

    def capped(self, write):
        con = real(self, write)
        if write:
            pages = con.execute("PRAGMA page_count").fetchone()[0]
            con.execute(f"PRAGMA max_page_count = {pages}")
        return con

    monkeypatch.setattr(Ledger, "_connect", capped)
    with pytest.raises(EvidenceError, match="the disk is full; free space there"):
        ledger.add("v51", None, "m", [float(i) for i in range(2000)], note="x" * 500)
    monkeypatch.undo()
    assert ledger.export() == before
