"""Check records: the one JSON-ready shape every verification result takes.

``check(name, passed, detail, figures)`` is one row of ``vecmerge verify``'s table; ``result`` gathers
rows into a verdict (passed only when every row passed). A check that could not run is a failure
with its reason (``not_run``): no check passes by default, and none passes on NaN (``within``).
"""

from __future__ import annotations

import math


def check(name: str, passed: bool, detail: str, figures: dict | None = None) -> dict:
    """One JSON-ready check: ``{name, passed, detail, figures}``.

    Args:
        name (str): short label. passed (bool). detail (str): one line naming the culprit on failure.
        figures (dict | None): numbers behind the verdict (JSON scalars and lists).
    """
    return {"name": name, "passed": bool(passed), "detail": detail, "figures": dict(figures or {})}


def not_run(name: str, why: str) -> dict:
    """A check that could not run counts as failed, with the reason."""
    return check(name, False, f"not run: {why}", {"skipped": True})


def result(target: str, checks: list[dict], **extra) -> dict:
    """``{target, passed, checks, ...}``: passed when every check passed."""
    return {"target": target, "passed": all(c["passed"] for c in checks), "checks": checks, **extra}


def within(value: float, tol: float) -> bool:
    """``value <= tol`` for a finite value; NaN and infinities never pass."""
    return isinstance(value, (int, float)) and math.isfinite(value) and value <= tol


def close(a: float, b: float, rtol: float, atol: float = 1e-12) -> bool:
    """``|a - b| <= atol + rtol |b|`` for finite a and b; False on NaN or infinities."""
    return math.isfinite(a) and math.isfinite(b) and abs(a - b) <= atol + rtol * abs(b)
