"""Issue 36 item 7: a stored plan is checked cell by cell and by its integrity record (a sha256 chained over the
plan rows): an unknown test name and a plan edited with SQL (its trigger dropped) are refused in one line."""

from __future__ import annotations

import hashlib
import json
import sqlite3

import pytest

from vecmerge.evidence import EvidenceError
from vecmerge.evidence.ledger.ledger import Ledger, Plan
from vecmerge.evidence.ledger.schema import PLAN_COLUMNS


def plan(**changes) -> Plan:
    fields = dict(id=0, a="v51", b="v28", metric="official_total", a_sha256=None, b_sha256=None, min_effect=0.01,
                  max_runs=10, alpha=0.05, higher_is_better=True, noise_sd=None, prior_scale=1.0,
                  test="group-sequential", design={"spending": "obf", "look_every": 1, "beta": 0.1})
    return Plan(**{**fields, **changes})


@pytest.fixture
def ledger(tmp_path) -> Ledger:
    ledger = Ledger(tmp_path / "vecmerge-evidence.db")
    ledger.add("v51", None, "official_total", [1.0180, 0.9895])
    ledger.add_plan(plan())
    ledger.add_plan(plan(min_effect=0.02))
    ledger.add_plan(plan(b="v54", test="t-mixture", design=None))
    return ledger


def sql(ledger: Ledger, *statements: str) -> None:
    con = sqlite3.connect(ledger.path)
    con.execute("DROP TRIGGER IF EXISTS plans_no_update")  # what a determined editor would do
    con.execute("DROP TRIGGER IF EXISTS plans_no_delete")
    for statement in statements:
        con.execute(statement)
    con.commit()
    con.close()


def test_each_plan_carries_the_sha256_of_its_cells_chained_to_the_plan_before(ledger):
    """The chain by hand: sha256(previous + newline + compact JSON of the row's cells, chain excluded)."""
    con = sqlite3.connect(ledger.path)
    rows = con.execute(f"SELECT {PLAN_COLUMNS} FROM plans ORDER BY id").fetchall()
    con.close()
    previous = ""
    for row in rows:
        text = json.dumps(list(row[:-1]), ensure_ascii=True, separators=(",", ":"))
        previous = hashlib.sha256(f"{previous}\n{text}".encode()).hexdigest()
        assert row[-1] == previous
    assert [p.chain for p in ledger.plans()] == [r[-1] for r in rows]
    assert ledger.plans()[0].design == {"spending": "obf", "look_every": 1, "beta": 0.1}


def test_a_stored_unknown_test_name_is_refused_when_a_plan_is_read(ledger):
    sql(ledger, "UPDATE plans SET test = 'welch-peeking' WHERE id = 2")
    with pytest.raises(EvidenceError) as err:
        ledger.plans()
    line = str(err.value)
    assert "plan 2: test: 'welch-peeking' is not a test vecmerge knows (group-sequential, t-mixture)" in line
    assert "\n" not in line and "restore the file from a copy" in line
    with pytest.raises(EvidenceError, match="welch-peeking"):
        ledger.add("v51", None, "official_total", 1.0)  # a write builds on the plans: refused, nothing written
    assert len(ledger.records()) == 2


def test_a_plan_refuses_an_unknown_test_name_when_recorded(ledger):
    with pytest.raises(EvidenceError, match="test: 'welch-peeking' is not a test vecmerge knows"):
        ledger.add_plan(plan(test="welch-peeking"))


@pytest.mark.parametrize("edit", ["UPDATE plans SET min_effect = 0.05 WHERE id = 1",
                                  "UPDATE plans SET max_runs = 3 WHERE id = 3",
                                  "UPDATE plans SET design = '{\"beta\":0.5}' WHERE id = 2",
                                  "UPDATE plans SET after_record = 0 WHERE id = 2"])
def test_a_plan_edited_with_sql_is_refused_by_its_integrity_record(ledger, edit):
    sql(ledger, edit)
    plan_id = edit.rsplit("= ", 1)[1]
    with pytest.raises(EvidenceError) as err:
        ledger.plans("v51")
    line = str(err.value)
    assert f"plan {plan_id}: its integrity record does not match its cells" in line and "\n" not in line
    assert "changed outside vecmerge (e.g. with SQL); restore the ledger from a copy" in line
    with pytest.raises(EvidenceError, match="integrity record"):
        ledger.add_plan(plan())


def test_a_deleted_or_unchained_plan_is_refused(ledger):
    sql(ledger, "DELETE FROM plans WHERE id = 2")
    with pytest.raises(EvidenceError, match="plan 3: its integrity record does not match"):
        ledger.plans()


def test_an_unchained_plan_after_a_chained_one_is_refused(ledger):
    sql(ledger, "UPDATE plans SET chain = NULL WHERE id = 3")
    with pytest.raises(EvidenceError, match="plan 3 has no integrity record, which every plan since schema 4 carries"):
        ledger.plans()


def test_plans_from_before_the_chain_are_read_and_the_chain_covers_them(ledger):
    """A schema-3 plan has no chain (NULL): read as it is; a later chained plan covers its cells too. (The
    migration to schema 4 recorded plan 2 as the first to carry a chain.)"""
    sql(ledger, "UPDATE plan_chain_start SET first_id = 2")
    sql(ledger, "UPDATE plans SET chain = NULL WHERE id = 1")
    assert [p.id for p in ledger.plans()] == [1, 2, 3] and ledger.plans()[0].chain is None
    sql(ledger, "UPDATE plans SET min_effect = 0.5 WHERE id = 1")
    with pytest.raises(EvidenceError, match="plan 2: its integrity record does not match"):
        ledger.plans()


def test_emptying_every_chain_does_not_make_plans_look_older_than_the_chain(ledger):
    """Stranger finding: NULL in every chain (and design) read every plan as a pre-schema-4 plan, so an edited
    D was used. Plans from the migration's first chained id on must carry their chain."""
    sql(ledger, "UPDATE plans SET chain = NULL, design = NULL")
    sql(ledger, "UPDATE plans SET min_effect = 0.5 WHERE id = 3")
    with pytest.raises(EvidenceError, match="plan 1 has no integrity record"):
        ledger.plans()
