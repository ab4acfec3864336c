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
    with pytest.raises(EvidenceError, match="ledger schema version 99, this vecmerge reads 1 to 3; upgrade vecmerge"):
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
