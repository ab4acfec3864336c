"""Pair records: written with their entries in one transaction or not at all; ledgers without them read as before."""

from __future__ import annotations

import sqlite3

import pytest

from vecmerge.evidence import EvidenceError
from vecmerge.evidence.ledger import pairs
from vecmerge.evidence.ledger.ledger import Entry, Ledger

SHA_A, SHA_B = "a" * 64, "b" * 64


def test_round_trip_in_one_transaction(tmp_path):
    ledger = Ledger(tmp_path / "l.db")
    assert pairs.records(ledger, ["probe:x:kl"]) == []  # no file yet
    ledger.add("a", SHA_A, "score", 1.0)
    assert pairs.records(ledger, ["probe:x:kl"]) == []  # a ledger without the table
    rows = [pairs.PairEntry("probe:x:kl", "q1", "a", SHA_A, "b", SHA_B, 0.25, "probe:x.jsonl@1"),
            pairs.PairEntry("probe:x:js", "q1", "a", SHA_A, "b", SHA_B, 0.05, "probe:x.jsonl@2")]
    ids, n = pairs.write(ledger, [Entry("a", "probe:x:loglik", -3.0, SHA_A, item="q1")], rows,
                         {"probe:x:loglik": True})
    assert len(ids) == 1 and n == 2 and ledger.direction("probe:x:loglik") is True
    assert pairs.records(ledger, ["probe:x:kl", "probe:x:js"]) == rows
    assert pairs.records(ledger, ["probe:x:kl", "probe:x:js"], "probe:x.jsonl@2") == rows[1:]


def test_a_bad_pair_writes_nothing(tmp_path):
    ledger = Ledger(tmp_path / "l.db")
    bad = pairs.PairEntry("probe:x:kl", "q1", "a", "nothex", "b", SHA_B, float("nan"), "s")
    with pytest.raises(EvidenceError, match="nothing recorded: 2 problem.*sha_a.*not finite"):
        pairs.write(ledger, [Entry("a", "m", 1.0)], [bad])
    assert not (tmp_path / "l.db").exists() or ledger.records() == []


def test_a_failure_inside_the_transaction_rolls_back_the_entries(tmp_path, monkeypatch):
    ledger = Ledger(tmp_path / "l.db")
    monkeypatch.setattr(pairs, "_INDEX", "CREATE INDEX nonsense ON nowhere (x)")
    with pytest.raises(EvidenceError, match="could not write"):
        pairs.write(ledger, [Entry("a", "m", 1.0)], [pairs.PairEntry("k", "q", "a", None, "b", None, 1.0, "s")])
    assert ledger.records() == []
    con = sqlite3.connect(tmp_path / "l.db")
    assert "pair_records" not in {r[0] for r in con.execute("SELECT name FROM sqlite_master")}
