"""Check records never pass on NaN or infinity, whatever the comparison."""

import math

from vecmerge.verify.checks.adapter import _law
from vecmerge.verify.report import check, close, not_run, result, within


def test_within_and_close_refuse_non_finite():
    assert within(1e-6, 1e-5) and within(1e-5, 1e-5) and not within(2e-5, 1e-5)
    for bad in (math.nan, math.inf, -math.inf, None, "1e-9"):
        assert not within(bad, 1e-5)
    assert close(1.0, 1.0 + 1e-13, 1e-12) and not close(1.0, 1.1, 1e-3)
    assert not close(math.nan, math.nan, 1.0) and not close(math.inf, math.inf, 1.0)


def test_a_law_with_a_nan_residual_fails():
    """``not v <= tol`` and ``v > tol`` differ exactly on NaN: the identity check must not pass it."""
    res = _law("x - x = 0", {"a": 1e-15, "b": math.nan}, 1e-9, "x - x = 0")
    assert not res["passed"] and res["figures"]["bad_modules"] == ["b"]


def test_result_needs_every_check():
    rows = [check("a", True, "fine"), not_run("b", "no input")]
    r = result("t", rows)
    assert not r["passed"] and r["checks"][1]["detail"] == "not run: no input"
    assert result("t", [check("a", True, "fine")])["passed"]


def test_a_check_that_did_not_run_says_so_in_its_figures():
    row = not_run("peft", "no base model")
    assert row == {"name": "peft", "passed": False, "detail": "not run: no base model", "figures": {"skipped": True}}


def test_close_is_inclusive_and_relative_to_the_reference():
    """|a - b| <= atol + rtol |b|: the bound itself passes (exactly representable numbers), and the tolerance
    scales with |b| (1e6 +- 1 is close at rtol 1e-6, not at 1e-7)."""
    assert close(1.5, 1.0, 0.25, atol=0.25) and not close(1.5, 1.0, 0.25, atol=0.125)
    assert close(1e6 + 1, 1e6, 1e-6, atol=0.0) and not close(1e6 + 1, 1e6, 1e-7, atol=0.0)
    assert close(4.0, 2.0, 1.0, atol=0.0) and not close(4.5, 2.0, 1.0, atol=0.0)
