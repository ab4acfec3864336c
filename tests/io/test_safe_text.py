"""Strangers' text made safe to show: escape sequences and controls removed, spreadsheet formulas neutralised."""

from __future__ import annotations

import csv
import io

import pytest

from vecmerge.io.safe_text import FORMULA_PREFIXES, printable, spreadsheet_cell, spreadsheet_text


@pytest.mark.parametrize("raw, shown", [
    ("v51", "v51"),
    ("\x1b[31mred\x1b[0m", "red"),                                   # SGR colour
    ("\x1b]8;;http://evil.example\x07click\x1b]8;;\x07", "click"),  # OSC 8 hyperlink, BEL-terminated
    ("\x1b]0;title\x1b\\after", "after"),                         # OSC, ST-terminated
    ("\x9b2Jcleared", "cleared"),                                  # C1 CSI (one character)
    ("\x1bcreset", "reset"),                                       # ESC c (full reset)
    ("a\x00b\x07c\x7fd\x85e", "abcd e"),                            # NUL, BEL, DEL removed; NEL is a break
    ("two\nlines\r\nand\ttab", "two lines and tab"),
    ("lone \x1b", "lone "),
    (1.5, "1.5"),
])
def test_printable_removes_escape_sequences_and_controls(raw, shown):
    assert printable(raw) == shown
    assert not any(ord(c) < 0x20 or 0x7f <= ord(c) <= 0x9f for c in printable(raw))


def test_printable_keeps_line_breaks_when_asked():
    assert printable("a\x1b[2Kb\nc\r\nd\te", keep_newlines=True) == "ab\nc\nd e"


@pytest.mark.parametrize("prefix", FORMULA_PREFIXES)
def test_every_formula_prefix_is_neutralised(prefix):
    for text in (f"{prefix}HYPERLINK(\"http://evil\",\"x\")", f"{prefix}SUM(A1:A9)", prefix,
                 f"{prefix}cmd|' /C calc'!A0"):
        cell = spreadsheet_cell(text)
        assert cell == "'" + text and spreadsheet_text(cell) == text


def test_the_prefix_list_is_owasps():
    assert set(FORMULA_PREFIXES) == {"=", "+", "-", "@", "\t", "\r"}


@pytest.mark.parametrize("number", ["-0.5", "+1", "-1e-3", "+.5", "-12.", "0.25"])
def test_plain_numbers_are_left_alone(number):
    assert spreadsheet_cell(number) == number and spreadsheet_text(number) == number


@pytest.mark.parametrize("text", ["-", "-x", "+1+1", "-1e", "--1", "@", "=1", "'", "''=x", "'abc", "plain", "",
                                  "a=b", "x-1"])
def test_the_rule_round_trips_through_a_real_csv_file(text):
    buf = io.StringIO()
    csv.writer(buf).writerow([spreadsheet_cell(text)])
    (cell,) = next(csv.reader(io.StringIO(buf.getvalue())))
    assert spreadsheet_text(cell) == text
    assert not cell.startswith(FORMULA_PREFIXES)  # none of these is a plain number


def test_cells_in_the_middle_are_not_formulas():
    assert spreadsheet_cell("a=b") == "a=b" and spreadsheet_cell("x-1") == "x-1"
