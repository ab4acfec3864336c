"""The report primitives: a table shows names printable, JSON stays exact."""

from __future__ import annotations

import json
from pathlib import Path

from vecmerge.report.format import table, to_json


def test_a_table_strips_escapes_and_controls_from_cells_and_headers_before_measuring_widths():
    text = table([("a\x1b[31mred\x1b]0;pwn\x07", 1.5, None), (Path("p\x1b[2Jq\nr"), 2, "x\ty")],
                 ["na\x7fme", "v", "z"])
    assert not set(text) & {"\x1b", "\x07", "\x7f", "\t"}
    lines = text.splitlines()
    assert lines[0].split() == ["name", "v", "z"] and lines[2].split() == ["ared", "1.5"]
    assert lines[3].split() == ["pq", "r", "2", "x", "y"]
    assert lines[1].split()[0] == "------"  # "name" and tabulate's padding: widths counted without escapes


def test_json_keeps_a_name_exact():
    name = "a\x1b[31mred\x07"
    assert json.loads(to_json({"name": name}))["name"] == name


def test_a_wrapped_cell_keeps_its_line_breaks():
    """verify's detail column is wrapped text: its line breaks are layout, not control characters to strip."""
    from vecmerge.report.format import table

    text = table([["files", "PASS", "exactly a, b,\nc; README.md as pinned"]], ["check", "result", "detail"], "simple")
    lines = text.splitlines()
    assert any(line.rstrip().endswith("exactly a, b,") for line in lines)
    assert any(line.strip() == "c; README.md as pinned" for line in lines)
