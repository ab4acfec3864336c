"""Expressions reduce to exact linear forms; parse errors point a caret at the fault."""

import pytest

from vecmerge.errors import ExpressionError
from vecmerge.expr import parse


@pytest.mark.parametrize("text, coeffs", [
    ("v54", {"v54": 1.0}),
    ("v51-v28", {"v51": 1.0, "v28": -1.0}),
    ("v54 + 0.122591020054269*(v51 - v28)", {"v54": 1.0, "v51": 0.122591020054269, "v28": -0.122591020054269}),
    ("-v28", {"v28": -1.0}),
    ("2*(a-b)", {"a": 2.0, "b": -2.0}),
    ("(a+b)/2", {"a": 0.5, "b": 0.5}),
    ("a - a", {"a": 0.0}),
    ("v54e2 + 1e-3*x.y", {"v54e2": 1.0, "x.y": 1e-3}),
    ("a*2*3 - -b", {"a": 6.0, "b": 1.0}),
    ("(1+1)*a", {"a": 2.0}),
])
def test_linear_forms(text, coeffs):
    assert parse(text).coeffs == pytest.approx(coeffs, rel=1e-15)


@pytest.mark.parametrize("text, col, why", [
    ("v54 + ", 7, "ends too early"),
    ("v54 + )", 7, r"unexpected '\)'"),
    ("a * b", 3, "cannot multiply two adapters"),
    ("a + 2", 3, "cannot add a number"),
    ("a / b", 5, "can only divide by a number"),
    ("(a - b", 7, r"expected '\)'"),
    ("a $ b", 3, "unexpected character '\\$'"),
    ("2 * 3", 1, "names no adapter"),
    ("", 1, "empty expression"),
    ("a / 0", 5, "division by zero"),
])
def test_parse_errors_show_a_caret(text, col, why):
    with pytest.raises(ExpressionError, match=why) as e:
        parse(text)
    msg = str(e.value)
    assert f"column {col}" in msg
    lines = msg.splitlines()
    assert lines[1] == f"  {text}" and lines[2] == "  " + " " * (col - 1) + "^"


def test_str_round_trips():
    f = parse("v54 + 0.122591020054269*(v51 - v28)")
    assert parse(str(f)).coeffs == f.coeffs


def test_out_of_range_number_in_an_expression(toy, run_cli):
    res = run_cli("refactor", "1e400*v28", "--out", "n")
    assert res.exit_code == 2 and "out of range" in res.output


@pytest.mark.parametrize("text, path", [
    ("runs/plain/ck3", "runs/plain/ck3"),
    ("v54 - runs/plain/ck3", "runs/plain/ck3"),
    ("/data/runs/ck3 - v28", "/data/runs/ck3"),
    ("./runs/ck3", "./runs/ck3"),
])
def test_a_folder_path_says_to_name_it_in_the_workspace(text, path):
    """Issue 12 item 12: a path is not 'division by a number'; the message names the fix."""
    with pytest.raises(ExpressionError) as e:
        parse(text)
    msg = str(e.value)
    assert f"{path!r} is a folder path" in msg and "vecmerge.yaml" in msg and f"ck3: {path}" in msg
    assert "can only divide" not in msg


def test_division_by_an_adapter_is_still_named_as_such():
    with pytest.raises(ExpressionError, match="can only divide by a number"):
        parse("v54 / v28")
