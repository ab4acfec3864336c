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


def test_cjk_sub_score_names_align_by_display_width():
    """Issue 33 item 7: 懂物料 takes six terminal columns, not three; every row's next column starts at one
    display column (widths counted independently: 2 per CJK character, from the Unicode table by hand)."""
    from vecmerge.report.format import display_width, table

    text = table([["懂物料", 0.2453], ["video", 0.3112], ["商品理解力", 0.1]], ["sub-score", "mean"])
    lines = text.splitlines()

    def width(s):  # by hand: the CJK Unified Ideographs block is wide
        return sum(2 if "\u4e00" <= ch <= "\u9fff" else 1 for ch in s)

    starts = {width(line[:line.index(v)]) for line, v in zip(lines[2:], ("0.2453", "0.3112", "0.1"))}
    assert len(starts) == 1 and display_width("懂物料") == 6 and display_width("video") == 5
    assert width(lines[1].split(" ")[0]) == 11  # the header's 9 + 2 (tabulate's minimum) > 商品理解力's 10
    ascii_only = table([["video", 0.3112]], ["sub-score", "mean"])
    import tabulate

    assert tabulate.WIDE_CHARS_MODE is False and ascii_only == tabulate.tabulate(
        [["video", 0.3112]], headers=["sub-score", "mean"], floatfmt=".4g", disable_numparse=True)
