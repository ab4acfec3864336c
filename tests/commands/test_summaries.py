"""The summaries' ledger operations over a real ledger file: show and ls's rows."""

from __future__ import annotations

import json

import pytest
from toy_ledger import CURRENT, NEW, OLD, V51, M, toy_ledger

from vecmerge.commands import recording
from vecmerge.commands import summaries as commands
from vecmerge.evidence import EvidenceError
from vecmerge.evidence.ledger.ledger import Ledger


@pytest.fixture
def ledger(tmp_path) -> Ledger:
    return toy_ledger(tmp_path / "vecmerge-evidence.db")


def test_show_leaves_stale_records_out_and_counts_them(ledger):
    out = commands.show(ledger, ["v51"], M, current_sha=CURRENT)
    (summary,) = out["summaries"]
    assert summary["n"] == 5 and summary["mean"] == pytest.approx(sum(V51) / 5, rel=1e-14)
    assert out["stale"] == [{"model": "v51", "metric": M, "records": 1, "sha256s": [OLD]}]
    with_stale = commands.show(ledger, ["v51"], M, current_sha=CURRENT, include_stale=True)
    assert with_stale["summaries"][0]["n"] == 6
    json.dumps(out)
    with pytest.raises(EvidenceError, match="no records of v5l"):
        commands.show(ledger, ["v5l"])


def test_ls_rows(ledger):
    entries = {"v51": {"path": "runs/v51", "sha256": NEW, "base_model": "B", "parent": "v28"},
               "v60": {"path": "runs/v60", "sha256": None, "base_model": "B", "parent": None}}
    rows = commands.ls_rows(entries, ledger, metric=M)
    assert rows[0]["sha256_short"] == NEW[:12] and rows[0]["runs"] == 5 and rows[0]["stale"] == 1
    assert rows[0]["mean"] == pytest.approx(sum(V51) / 5, rel=1e-14)
    assert rows[1]["runs"] == 0 and rows[1]["mean"] is None
    assert commands.ls_rows(entries, None)[0]["runs"] is None


def test_show_reports_the_grid_of_the_published_grades(tmp_path):
    """examples/evidence/grades.csv: the six published grades of the item sub-score (懂物料), v51's five runs."""
    from pathlib import Path

    ledger = Ledger(tmp_path / "l.db")
    recording.import_(ledger, [Path(__file__).parents[2] / "examples" / "evidence" / "grades.csv"])
    (grid,) = commands.show(ledger)["grids"]
    assert grid["metric"] == "item_understanding" and grid["sub"] is None and grid["multiples"]
    assert 0.0306 <= grid["step"] <= 0.0307 and grid["grades"] == [0, 1, 2, 3, 4, 5]
