"""The precision a score was written with: decimals from the input's text (CSV cells, JSON numbers, CLI values)
or declared, kept per metric and sub-score in the ledger; grades are found only at a known precision."""

from __future__ import annotations

import json

import pytest

from vecmerge.commands.judging import compare_models as compare
from vecmerge.commands.recording import add
from vecmerge.commands.summaries import show
from vecmerge.evidence import EvidenceError
from vecmerge.evidence.importers.importers import import_files
from vecmerge.evidence.ledger.ledger import Ledger
from vecmerge.evidence.ledger.precision import check_decimals, decimals_of, read
from vecmerge.io.parse import Written, parse_json

GRADES = ["0.0920", "0.1226", "0.1533", "0.1840", "0.2146", "0.2453"]


def test_decimals_are_counted_in_the_text_not_the_float():
    assert [decimals_of(t) for t in ("0.1480", "0.148", "1.5e-3", "12", "1E+2", " 0.20 ")] == [4, 3, 4, 0, 0, 2]
    assert decimals_of("abc") is None and decimals_of("nan") is None
    data = parse_json('{"a": 0.1480, "b": 2, "c": [1.50]}', "x.json", keep_text=True)
    assert data["a"] == 0.148 and data["a"].text == "0.1480" and data["c"][0].text == "1.50"
    assert isinstance(data["b"], int) and type(parse_json('{"a": 0.1480}', "x.json")["a"]) is float
    assert Written("0.1480") == 0.148 and repr(float(Written("0.1480"))) == "0.148"  # the repr says 3
    with pytest.raises(EvidenceError, match="--decimals 21: give the decimals"):
        check_decimals(21)


def test_invented_grades_from_csv_text_set_no_margin(tmp_path):
    """Issue 33 item 4's finding: {0.145, 0.148, 0.151, 0.153} (0.1480 written with 4 decimals) became "grades of
    0.0016", which set the gate's margin; now no grid, and the margin says it is the pooled noise sd."""
    rows = [("u1", "0.1450"), ("u1", "0.1480"), ("u2", "0.1510"), ("u2", "0.1530")]
    csv = tmp_path / "s.csv"
    csv.write_text("model,metric,value,sub.place\n" + "".join(f"{m},total,1.0,{v}\n" for m, v in rows))
    ledger = Ledger(tmp_path / "ev.db")
    import_files(ledger, [csv], directions={"total": True})
    assert read(ledger) == {("total", None): 1, ("total", "place"): 4}  # "1.0" has 1; "0.1480" has 4, not 3
    out = compare(ledger, "u1", "u2", "total")
    row = out["subscores"]["subscores"]["place"]
    assert row["grid"] is None and row["margin_source"] == "pooled within-model noise sd"
    assert show(ledger)["grids"] == []


def test_the_users_grades_from_text_give_the_grade_margin_and_say_so(tmp_path):
    csv = tmp_path / "s.csv"
    csv.write_text("model,metric,value,sub.item\n" + "".join(f"m{i},total,1,{v}\n" for i, v in enumerate(GRADES))
                   + "x,total,1,0.2453\nx,total,1,0.2146\ny,total,1,0.2146\ny,total,1,0.2146\n")
    ledger = Ledger(tmp_path / "ev.db")
    import_files(ledger, [csv], directions={"total": True})
    (grid,) = show(ledger)["grids"]
    assert grid["sub"] == "item" and 0.0306 <= grid["step"] <= 0.0307 and grid["tolerance"] == 5e-05
    row = compare(ledger, "x", "y", "total")["subscores"]["subscores"]["item"]
    assert row["margin"] == pytest.approx(grid["step"], rel=1e-12)
    assert row["margin_source"].startswith("one grade, 0.03066: 6 distinct values sit on it within their written "
                                           "precision 1e-04")
    from vecmerge.report.evidence import render_subscores

    assert "margin of item: one grade, 0.03066" in "\n".join(render_subscores(
        compare(ledger, "x", "y", "total")["subscores"]))


def test_values_added_as_plain_floats_have_no_precision_unless_declared(tmp_path):
    ledger = Ledger(tmp_path / "ev.db")
    for i, v in enumerate(GRADES):
        add(ledger, f"m{i}", [1.0], metric="total", sha256=None, subs={"item": float(v)}, external=True)
    assert read(ledger) == {} and show(ledger)["grids"] == []
    add(ledger, "m9", [1.0], metric="total", sha256=None, subs={"item": 0.2453}, external=True, decimals=4)
    assert read(ledger) == {("total", None): 4, ("total", "item"): 4}
    assert [g["sub"] for g in show(ledger)["grids"]] == ["item"]
    add(ledger, "m10", [Written("1.00000")], metric="total", sha256=None, external=True)
    assert read(ledger)[("total", None)] == 5  # the most decimals seen is kept
    assert json.dumps(read(ledger, "other")) == "{}"
