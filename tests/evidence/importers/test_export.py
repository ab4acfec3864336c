"""``evidence export`` streamed from the stored rows: the same bytes as formatting every ``Record.to_dict`` at once
(the csv module through ``export_csv_text``, ``json.dumps(..., indent=2)``), and a tampered cell still refused
naming its record."""

from __future__ import annotations

import json
import sqlite3

import pytest

from vecmerge.evidence import EvidenceError
from vecmerge.evidence.importers.export import export_csv, export_json
from vecmerge.evidence.importers.importers import export_csv_text
from vecmerge.evidence.ledger.ledger import Ledger

TEXTS = ["plain", "=1+1", "-cmd", "+3", "-2.5", "@SUM(A1)", "'quoted", 'say "hi", ok', "a,b", "\u00e9 \u65e5",
         "x\u2028y", "1e5"]
SHA = "a" * 64


@pytest.fixture
def ledger(tmp_path) -> Ledger:
    """Every kind of cell an export writes: names that look like formulas or numbers, quotes, commas, line
    separators, escapes in notes, sub-scores and environments of several shapes, stale and unhashed records, and
    cells only SQL writes (a created time that is a formula, an empty one)."""
    ledger = Ledger(tmp_path / "vecmerge-evidence.db")
    ledger.set_direction("official_total", True)
    for i, model in enumerate(["v1", "=v2", "-v3"]):
        ledger.add(model, SHA if i != 1 else None, "official_total", [0.5, 1 / 3, -2e-300, 1e22],
                   subs=[{"video": 0.25, "q\u00e9": 1e-300}, {}, {"a,b": -0.0}, {"=s": 5e-324}],
                   stderr=[None, 0.01][i % 2], note=[None, "\x1b]8;;http://x\x07click\x1b]8;;\x07", "a\nb\t\x85c"][i],
                   env=[None, {"temperature": 0}, {"temperature": 0.7, "model_args": "x=1,y=2"}][i])
        ledger.add_items(model, SHA, "probe:x", {t + str(i): v for t, v in zip(TEXTS, [-1.5, 0.1, 1 / 7, 2.0] * 3)},
                         clusters={t + str(i): t for t in TEXTS[::2]}, subscores={t + str(i): t for t in TEXTS[1::3]},
                         note=TEXTS[i])
    con = sqlite3.connect(ledger.path)
    con.execute("UPDATE records SET created = '=NOW()' WHERE id % 7 = 0")
    con.execute("UPDATE records SET created = '' WHERE id % 11 = 0")
    con.commit()
    con.close()
    return ledger


@pytest.mark.parametrize("current", [None, {"v1": SHA, "=v2": "b" * 64, "-v3": None}])
def test_export_is_the_records_formatted_at_once_byte_for_byte(ledger, current):
    """CSV: ``export_csv_text`` of ``Ledger.export()`` (the csv module cell by cell); JSON: one ``json.dumps``."""
    rows = ledger.export(current_sha=current)
    assert any(r["stale"] for r in rows) == bool(current) and any(r["env.temperature"] for r in rows if
                                                                 "env.temperature" in r)
    assert "".join(export_csv(ledger, current)) == export_csv_text(rows)
    want = json.dumps({"directions": ledger.directions(), "records": rows}, indent=2) + "\n"
    assert "".join(export_json(ledger, current)) == want


def test_values_whose_sum_overflows_take_the_row_by_row_check_and_export_as_they_are(tmp_path):
    ledger = Ledger(tmp_path / "vecmerge-evidence.db")
    ledger.add("v1", None, "m", [1e308, 1e308, -1e308])
    rows = ledger.export()
    assert "".join(export_csv(ledger)) == export_csv_text(rows)
    assert json.loads("".join(export_json(ledger)))["records"] == rows


@pytest.mark.parametrize("sql, match", [
    ("UPDATE records SET value = 'abc' WHERE id = 18", r"record 18 \(=v2, official_total\): value 'abc' is not a"),
    ("UPDATE records SET item = 'q ' WHERE id = 40", r"record 40 \(-v3, probe:x\): item 'q ' is not a name"),
    ("UPDATE records SET stderr = -1.0 WHERE id = 34", r"record 34 \(-v3, official_total\): stderr -1.0 is not"),
    ("UPDATE records SET sha256 = 'xyz' WHERE id = 20", r"record 20 .*: sha256 'xyz' is not 64 lowercase hex"),
    ("UPDATE records SET created = x'00' WHERE id = 3", r"record 3 \(v1, official_total\): created b'\\x00' is not"),
    ("UPDATE records SET subs = '{oops' WHERE id = 17", r"record 17 .*: its stored sub-scores '\{oops' are unread"),
    ("UPDATE records SET env = '[' WHERE id = 33", r"record 33 \(-v3, official_total\): env '\[' is not valid"),
    ("UPDATE records SET cluster = 'c' || char(27) WHERE id = 25", r"record 25 .*: cluster 'c\\x1b' is not a name"),
])
def test_a_tampered_cell_is_refused_naming_its_record_in_both_formats(ledger, sql, match):
    """The message is the one every read gives (``Ledger.records``): the first bad row, by id."""
    con = sqlite3.connect(ledger.path)
    con.execute(sql)
    con.commit()
    con.close()
    with pytest.raises(EvidenceError, match=match) as info:
        ledger.records()
    for export in (export_csv, export_json):
        with pytest.raises(EvidenceError) as got:
            "".join(export(ledger))
        assert str(got.value) == str(info.value)
