"""The ledger and its text are strangers' (issue 23): read-only commands work on read-only media and change no
byte; hostile contents are one ``error:`` line naming the record (exit 2, never an internal error); names, notes
and metrics reach terminals and spreadsheets without escape sequences or formulas."""

from __future__ import annotations

import csv
import io
import os
import sqlite3

import pytest

WORKSPACE = """adapters:
  v28: {path: v28, parent: null}
  v51: {path: v51, parent: v28}
  v54e2: {path: v54e2, parent: null}
  v54: {path: v54, parent: v54e2}
metric: official_total
"""
READ_ONLY = [("evidence", "show"), ("evidence", "compare", "v51", "v28"), ("evidence", "export"),
             ("evidence", "export", "--json"), ("ls",), ("evidence", "calibrate", "--proxy", "local", "--target",
                                                        "official_total", "--min-models", "3"),
             ("evidence", "decide", "v51", "--vs", "v28"),
             ("gate", "--base", "v54", "--dir", "v51-v28", "--consensus-ref", "v54-v54e2", "--trust", "0.0113")]


def ok(res, codes=(0,)):
    assert res.exit_code in codes, res.output
    return res


def one_line(res, code: int = 2) -> str:
    assert res.exit_code == code, res.output
    (line,) = res.stderr.strip().splitlines()
    assert line.startswith("error: ") and "Traceback" not in res.output and "internal error" not in line
    return line


@pytest.fixture
def ws(toy, run_cli):
    (toy / "vecmerge.yaml").write_text(WORKSPACE)
    ok(run_cli("evidence", "add", "v51", "1.0180", "0.9895", "1.0004", "--higher-is-better"))
    ok(run_cli("evidence", "add", "v28", "0.9836", "0.9890"))
    ok(run_cli("evidence", "add", "v54", "0.9940", "0.9950", "0.9946"))
    ok(run_cli("evidence", "add", "v51", "0.8", "--metric", "local", "--higher-is-better"))
    ok(run_cli("evidence", "plan", "v51", "--vs", "v28", "--min-effect", "0.01", "--max-runs", "6"))
    return toy


def files(folder):
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}


def test_read_only_commands_work_where_the_folder_cannot_be_written(ws, run_cli, monkeypatch):
    """os.access says the folder is read-only (it is what SQLite's immutable mode is for, and it works as root);
    each read-only command then reads the ledger with mode=ro&immutable=1 and no file in the folder changes."""
    real = os.access
    folder = ws.resolve()
    monkeypatch.setattr(os, "access", lambda p, mode: False if mode == os.W_OK and os.path.realpath(p) == str(
        folder) else real(p, mode))
    opened = []
    connect = sqlite3.connect
    monkeypatch.setattr(sqlite3, "connect", lambda *a, **k: opened.append(str(a[0])) or connect(*a, **k))
    before = files(ws)
    for args in READ_ONLY:
        ok(run_cli(*args), codes=(0, 1))  # the gate may fail its conditions; it must run
    assert files(ws) == before
    ledger_opens = [u for u in opened if "vecmerge-evidence.db" in u]
    assert ledger_opens and all(u.endswith("?mode=ro&immutable=1") for u in ledger_opens)


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores a folder's permissions (the test above covers it)")
def test_read_only_commands_on_a_chmod_read_only_folder(ws, run_cli):
    before = files(ws)
    ws.chmod(0o555)
    try:
        for args in READ_ONLY[:5]:
            ok(run_cli(*args))
        assert "evidence ledger" in one_line(run_cli("evidence", "add", "v51", "1.0"))
    finally:
        ws.chmod(0o755)
    assert files(ws) == before


RECORD_READERS = [("evidence", "show"), ("evidence", "compare", "v51", "v28"), ("evidence", "export"), ("ls",),
                  ("evidence", "decide", "v51", "--vs", "v28")]


@pytest.mark.parametrize("sql, match, readers", [
    ("UPDATE records SET subs = '{oops' WHERE id = 2",
     "record 2 (v51, official_total): its stored sub-scores '{oops' are unreadable",
     RECORD_READERS),
    ("UPDATE records SET value = 'abc' WHERE id = 1", "record 1 (v51, official_total): value 'abc' is not a",
     RECORD_READERS),
    ("UPDATE records SET env = '[' WHERE id = 4", "record 4 (v28, official_total): env '[' is not valid JSON",
     RECORD_READERS),
    ("UPDATE directions SET higher_is_better = 'yes'", "higher_is_better 'yes' is not true (1) or false (0)",
     [("evidence", "show"), ("evidence", "compare", "v51", "v28"), ("evidence", "export", "--json"),
      ("evidence", "add", "v51", "1.0")]),
])
def test_hostile_ledger_contents_are_one_line_for_every_reader(ws, run_cli, sql, match, readers):
    con = sqlite3.connect(ws / "vecmerge-evidence.db")
    con.execute(sql)
    con.commit()
    con.close()
    for args in readers:
        assert match in one_line(run_cli(*args)), args


def test_a_text_schema_version_is_one_line(ws, run_cli):
    con = sqlite3.connect(ws / "vecmerge-evidence.db")
    con.execute("DROP TABLE schema_version")
    con.execute("CREATE TABLE schema_version (version TEXT)")
    con.execute("INSERT INTO schema_version VALUES ('3')")
    con.commit()
    con.close()
    for args in (("evidence", "show"), ("evidence", "add", "v51", "1.0")):
        assert "schema version '3' is stored as text, not an integer" in one_line(run_cli(*args))


def test_escapes_never_reach_the_terminal_and_formulas_never_reach_a_spreadsheet(ws, run_cli):
    con = sqlite3.connect(ws / "vecmerge-evidence.db")  # a stranger's import wrote these (older vecmerge let them in)
    con.execute("UPDATE records SET note = ? WHERE id = 1", ("\x1b]8;;http://evil\x07click\x1b]8;;\x07",))
    con.commit()
    con.close()
    (ws / "evil.csv").write_text('model,metric,value,note\n"=HYPERLINK(""http://evil"",""x"")",official_total,0.5,'
                                 '"@SUM(A1:A9)"\n-cmd,official_total,-0.25,+1+1\n')
    ok(run_cli("evidence", "import", "evil.csv"))
    for args in (("evidence", "show"), ("evidence", "export"), ("ls",), ("evidence", "compare", "v51", "v28")):
        out = ok(run_cli(*args)).stdout
        assert "\x1b" not in out and "\x07" not in out
    rows = list(csv.DictReader(io.StringIO(ok(run_cli("evidence", "export")).stdout)))
    cells = [c for r in rows for c in r.values() if c]
    assert not [c for c in cells if c[0] in "=@\t\r" or (c[0] in "+-" and not c.lstrip("+-").replace(".", "").replace(
        "e", "").replace("-", "").isdigit())]
    assert {r["model"] for r in rows} >= {"'=HYPERLINK(\"http://evil\",\"x\")", "'-cmd"}
    assert [r["note"] for r in rows if r["id"] == "1"] == ["click"]
    line = one_line(run_cli("evidence", "add", "v51\x1b[2J", "1.0", "--external"))
    assert "\x1b" not in line and "control character 0x1b" in line
    assert "control character 0x00" in one_line(run_cli("evidence", "add", "v5\x001", "1.0", "--external"))


WRITERS = [("evidence", "add", "v28", "0.7"), ("evidence", "add", "v28", "0.7", "--metric", "acc"),
           ("evidence", "import", "more.csv"),
           ("evidence", "plan", "v54", "--vs", "v28", "--min-effect", "0.01", "--max-runs", "6")]


@pytest.mark.parametrize("sql, match", [
    ("INSERT INTO directions VALUES ('acc', 'yes', 'x')", "direction of 'acc': higher_is_better 'yes' is not true"),
    ("UPDATE records SET subs = 'not json{' WHERE id = 2",
     "record 2 (v51, official_total): its stored sub-scores 'not json{' are unreadable"),
])
def test_a_refused_write_writes_nothing(ws, run_cli, sql, match):
    """The stranger's probe: `evidence add` said error (exit 2) yet its record was written, since the check of the
    stored direction ran on the read after the write. Every writer now refuses first: the same one line, the
    ledger the same byte for byte."""
    (ws / "more.csv").write_text("model,metric,value\nv28,official_total,0.97\n")
    con = sqlite3.connect(ws / "vecmerge-evidence.db")
    con.execute(sql)
    con.commit()
    con.close()
    before = (ws / "vecmerge-evidence.db").read_bytes()
    for args in WRITERS:
        line = one_line(run_cli(*args))
        assert match in line and "changed outside vecmerge" in line, args
        assert (ws / "vecmerge-evidence.db").read_bytes() == before, args
    con = sqlite3.connect(ws / "vecmerge-evidence.db")
    assert con.execute("SELECT COUNT(*) FROM records").fetchone() == (9,)
    assert con.execute("SELECT COUNT(*) FROM plans").fetchone() == (1,)
    con.close()
