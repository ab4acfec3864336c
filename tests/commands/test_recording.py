"""The recording commands' ledger operations over a real ledger file: add, import and export."""

from __future__ import annotations

import csv
import io
import json

import pytest
from toy_ledger import CURRENT, V51, M, toy_ledger

from vecmerge.commands import recording as commands
from vecmerge.evidence import EvidenceError
from vecmerge.evidence.ledger.ledger import Ledger


@pytest.fixture
def ledger(tmp_path) -> Ledger:
    return toy_ledger(tmp_path / "vecmerge-evidence.db")


def test_add_returns_ids_and_direction(ledger):
    out = commands.add(ledger, "v59", [0.9944], metric=M, sha256=None, subs={"item": 0.2453})
    assert out["ids"] == [12] and out["direction"] is True and out["values"] == [0.9944]
    with pytest.raises(EvidenceError, match=r"--sub item has 1 value\(s\) for 2 run\(s\); give one per run"):
        commands.add(ledger, "v59", [0.99, 0.98], metric=M, sha256=None, subs={"item": 0.2})
    json.dumps(out)


def test_add_records_one_sub_score_per_run(ledger):
    """The multi-run form: --sub KEY=V1,V2,... gives run i the i-th value (v51's five runs, 0.2453 each)."""
    out = commands.add(ledger, "v51b", V51, metric=M, sha256=None, subs={"item": [0.2453] * 5, "video": V51[::-1]})
    runs = [r for r in ledger.records(["v51b"], M)]
    assert [r.value for r in runs] == V51 and [r.sub_scores for r in runs] == [
        {"item": 0.2453, "video": v} for v in V51[::-1]]
    assert out["subs"] == {"item": [0.2453] * 5, "video": V51[::-1]}
    with pytest.raises(EvidenceError, match=r"--sub item has 4 value\(s\) for 5 run\(s\)"):
        commands.add(ledger, "v51b", V51, metric=M, sha256=None, subs={"item": [0.2453] * 4})
    assert len(ledger.records(["v51b"], M)) == 5  # nothing half-written


def test_export(ledger):
    rows = list(csv.DictReader(io.StringIO(commands.export(ledger, "csv", current_sha=CURRENT))))
    assert len(rows) == 11 and sum(r["stale"] == "True" for r in rows) == 1
    data = json.loads(commands.export(ledger, "json"))
    assert data["directions"] == {M: True} and len(data["records"]) == 11
    with pytest.raises(EvidenceError, match="--format xml"):
        commands.export(ledger, "xml")
