"""Hostile ledger contents (issue 23): a ledger changed outside vecmerge is refused naming the record, one line,
never an internal error. Each case writes the bad cell with sqlite3 directly, as an editor or a script would."""

from __future__ import annotations

import sqlite3

import pytest

from vecmerge.evidence import EvidenceError
from vecmerge.evidence.ledger.ledger import Ledger


@pytest.fixture
def ledger(tmp_path) -> Ledger:
    ledger = Ledger(tmp_path / "vecmerge-evidence.db")
    ledger.add("v51", None, "official_total", [1.0, 1.01], subs=[{"video": 0.3}, {}],
               env={"temperature": 0})
    ledger.set_direction("official_total", True)
    return ledger


def tamper(ledger, sql, *args):
    con = sqlite3.connect(ledger.path)
    con.execute(sql, args)
    con.commit()
    con.close()


SUBS, ENV = "UPDATE records SET subs = ? WHERE id = 2", "UPDATE records SET env = ? WHERE id = 1"


@pytest.mark.parametrize("sql, args, match", [
    (SUBS, ("{not json",), r"record 2 \(v51, official_total\): its stored sub-scores '\{not json' are unreadable"),
    (SUBS, ("[1, 2]",), "record 2 .*sub-scores '\\[1, 2\\]' are unreadable \\(not a JSON object of numbers"),
    (SUBS, ('{"video": "high"}',), "record 2 .*are unreadable \\(not a JSON object of numbers"),
    (SUBS, ("[" * 100_000 + "]" * 100_000,), "record 2 .*sub-scores .*nested too deeply"),
    (SUBS, ('{"v": ' + "9" * 100_000 + "}",), "record 2 .*an integer of 100000 digits"),
    (SUBS, ('{"v": NaN}',), "record 2 .*NaN is not a JSON number"),
    ("UPDATE records SET value = ? WHERE id = 1", ("abc",), "record 1 .*value 'abc' is not a finite number"),
    ("UPDATE records SET stderr = ? WHERE id = 1", (-1.0,), "record 1 .*stderr -1.0 is not a finite number >= 0"),
    ("UPDATE records SET model = ? WHERE id = 1", ("v\x1b[2J51",), "record 1 .*model .* control character"),
    ("UPDATE records SET sha256 = ? WHERE id = 1", ("xyz",), "record 1 .*sha256 'xyz' is not 64 lowercase hex"),
    (ENV, ("temperature=0",), "record 1 .*env 'temperature=0' is not valid JSON"),
    (ENV, ('{"temperature": 0}',), "record 1 .*env .* is not a JSON object of environment"),
    (ENV, ('{"temperature": "0.0"}',), "record 1 .*env .* is not in canonical form"),
    ("UPDATE records SET created = ? WHERE id = 1", (b"\x00",), "record 1 .*created b'\\\\x00' is not a time"),
    ("UPDATE directions SET higher_is_better = ?", ("yes",),
     "direction of 'official_total': higher_is_better 'yes' is not true"),
    ("UPDATE directions SET higher_is_better = ?", (2,), "higher_is_better 2 is not true \\(1\\) or false \\(0\\)"),
    ("UPDATE schema_version SET version = ?", ("three",), "schema version 'three' is stored as text, not an integer"),
    ("UPDATE schema_version SET version = ?", (0,), "ledger schema version 0 does not exist"),
    ("INSERT INTO schema_version VALUES (?)", (3,), "the schema_version table holds 2 rows"),
])
def test_hostile_contents_are_refused_naming_the_record(ledger, sql, args, match):
    tamper(ledger, sql, *args)
    with pytest.raises(EvidenceError, match=match) as info:
        ledger.records()
        ledger.directions()
    text = str(info.value)
    assert "\n" not in text and len(text) < 400 and text.startswith(str(ledger.path))
    assert "changed outside vecmerge: delete that row or restore the file" in text


def test_a_schema_version_in_a_text_column_is_refused(ledger):
    """The probe's case: a schema_version table whose column holds the text '3' (an INTEGER column would convert it)."""
    con = sqlite3.connect(ledger.path)
    con.execute("DROP TABLE schema_version")
    con.execute("CREATE TABLE schema_version (version TEXT)")
    con.execute("INSERT INTO schema_version VALUES ('3')")
    con.commit()
    con.close()
    for action in (ledger.records, lambda: ledger.add("v51", None, "official_total", 1.0)):
        with pytest.raises(EvidenceError, match="schema version '3' is stored as text, not an integer"):
            action()


def test_a_plan_with_a_hostile_flag_is_refused(ledger):
    from vecmerge.evidence.ledger.ledger import Plan

    ledger.add_plan(Plan(0, "v51", "v28", "official_total", None, None, 0.01, 10, 0.05, True, None, 1.0, "t-mixture"))
    con = sqlite3.connect(ledger.path)
    con.execute("DROP TRIGGER plans_no_update")  # what a determined editor would do
    con.execute("UPDATE plans SET higher_is_better = 'yes'")
    con.commit()
    con.close()
    with pytest.raises(EvidenceError, match=r"plan 1: higher_is_better 'yes' is not true \(1\) or false \(0\)"):
        ledger.plans()


def test_a_newer_ledger_asks_for_an_upgrade(ledger):
    tamper(ledger, "UPDATE schema_version SET version = 99")
    with pytest.raises(EvidenceError, match="ledger schema version 99, this vecmerge reads 1 to 4; upgrade vecmerge"):
        ledger.records()


def _writes():
    from vecmerge.evidence.ledger import pairs
    from vecmerge.evidence.ledger.ledger import Entry, Plan

    pair = pairs.PairEntry("probe:t:kl", "1", "v51", None, "v28", None, 0.5, "probe:t.jsonl@x")
    return {
        "add": lambda led: led.add("v51", None, "official_total", 0.7),
        "add with a direction": lambda led: led.write([Entry("v51", "acc", 0.7)], {"acc": True}),
        "items": lambda led: led.add_items("v51", None, "official_total", {"a": 1.0}),
        "direction": lambda led: led.set_direction("acc", True),
        "plan": lambda led: led.add_plan(Plan(0, "v51", "v28", "official_total", None, None, 0.01, 10, 0.05, True,
                                              None, 1.0, "t-mixture")),
        "probe's pairs": lambda led: pairs.write(led, [Entry("v51", "probe:t:loglik", -1.0, item="1")], [pair]),
    }


@pytest.mark.parametrize("write", list(_writes()))
@pytest.mark.parametrize("sql, args, match", [
    ("UPDATE directions SET higher_is_better = ?", ("yes",), "higher_is_better 'yes' is not true"),
    (SUBS, ("not json{",), r"record 2 \(v51, official_total\): its stored sub-scores 'not json\{' are unreadable"),
    ("UPDATE records SET value = ? WHERE id = 1", ("abc",), "record 1 .*value 'abc' is not a finite number"),
])
def test_a_write_into_a_changed_ledger_is_refused_and_writes_nothing(ledger, write, sql, args, match):
    """Issue 23 follow-up: every stored row a write builds on is checked inside its transaction before it writes
    (``stored.check_rows``): the refusal names the record and the file is the same byte for byte."""
    tamper(ledger, sql, *args)
    before = ledger.path.read_bytes()
    with pytest.raises(EvidenceError, match=match) as info:
        _writes()[write](ledger)
    assert "\n" not in str(info.value) and "changed outside vecmerge" in str(info.value)
    assert ledger.path.read_bytes() == before
    con = sqlite3.connect(ledger.path)
    assert con.execute("SELECT COUNT(*) FROM records").fetchone() == (2,)
    con.close()


def test_the_fast_name_check_accepts_exactly_what_name_problem_accepts():
    """``stored.is_name`` (a regex, for a million rows) against ``records.name_problem`` (the rule), on every
    character below U+3100 alone, inside a name and at its edges, and on non-text cells."""
    from vecmerge.evidence.ledger.records import name_problem
    from vecmerge.evidence.ledger.stored import is_name

    cases = ["", "a", "a b", 5, 1.5, None, b"ab"]
    for code in range(0x3100):
        c = chr(code)
        cases += [c, f"a{c}b", f"{c}ab", f"ab{c}"]
    wrong = [c for c in cases if is_name(c) != (name_problem(c, "x") is None)]
    assert wrong == []


def test_export_streamed_equals_the_whole_ledger_formatted_at_once(ledger):
    """``export_lines`` streams; its JSON is ``json.dumps(..., indent=2)`` of every record at once, its CSV the same
    rows (read back with the csv module), stale flags, sub-scores and environments included."""
    import csv
    import io
    import json

    from vecmerge.commands.recording import export_lines

    ledger.add("v51", "a" * 64, "official_total", [0.5, 1 / 3], subs=[{"video": 0.25, "q\u00e9": 1e-300}, {}],
               note='say "hi", \u00e9', env={"temperature": 0})
    ledger.add_items("v52", None, "probe:x", {"q1": -1.5, "q2": -0.25}, clusters={"q1": "c"},
                     subscores={"q2": "t"})
    current = {"v51": "a" * 64}
    whole = [r.to_dict() for r in ledger.records(current_sha=current, include_stale=True)]
    assert any(r["stale"] for r in whole) and any(not r["stale"] for r in whole)
    text = "".join(export_lines(ledger, "json", current_sha=current))
    assert text == json.dumps({"directions": ledger.directions(), "records": whole}, indent=2) + "\n"
    rows = list(csv.DictReader(io.StringIO("".join(export_lines(ledger, "csv", current_sha=current)))))
    assert [r["id"] for r in rows] == [str(r["id"]) for r in whole]
    for got, want in zip(rows, whole):
        assert float(got["value"]) == want["value"] and got["stale"] == str(want["stale"])
        assert {k: float(v) for k, v in got.items() if k.startswith("sub.") and v} == \
            {k: v for k, v in want.items() if k.startswith("sub.")}
        assert got["subscore"] == (want["subscore"] or "") and got["note"] == (want["note"] or "")
    empty = Ledger(ledger.path.with_name("empty.db"))
    assert json.loads("".join(export_lines(empty, "json"))) == {"directions": {}, "records": []}


def test_a_plan_naming_a_test_the_registry_does_not_know_is_refused(ledger):
    """Issue 32: a plan's stored test is one the registry knows (``difference.names(plan=True)``); a row changed to
    another name (``welch-peeking``) is refused on read and on every write, naming the plan and the fix."""
    from vecmerge.evidence.ledger.ledger import Plan

    ledger.add_plan(Plan(0, "v51", "v28", "official_total", None, None, 0.01, 10, 0.05, True, None, 1.0, "t-mixture"))
    assert [p.test for p in ledger.plans()] == ["t-mixture"]
    con = sqlite3.connect(ledger.path)
    con.execute("DROP TRIGGER plans_no_update")
    con.execute("UPDATE plans SET test = 'welch-peeking'")
    con.commit()
    con.close()
    line = (r"plan 1: test: 'welch-peeking' is not a test vecmerge knows \(group-sequential, t-mixture\); "
            r"the ledger was changed outside vecmerge: delete that row or restore the file from a copy$")
    for action in (ledger.plans, lambda: ledger.add("v51", None, "official_total", 0.7)):
        with pytest.raises(EvidenceError, match=line):
            action()
