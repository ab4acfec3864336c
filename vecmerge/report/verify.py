"""Rendering ``vecmerge verify`` results: one row per check (PASS/FAIL, detail, key figures), then a verdict.

Only scalar figures are shown in the table (numbers with 4 significant digits, alpha with ``repr``);
``--json`` carries everything, per-module lists included.
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping
from typing import Any

from ..errors import few
from .format import g, table

# Figures shown in the table, in this order; the rest are JSON only.
_SHOWN = ("max_rel_error", "worst_module", "rel_error", "survival", "residual", "alpha", "rel_max_diff",
          "tolerance", "modules", "wrapped", "bad_modules", "scales")
_FULL = ("alpha", "recorded_alpha")
DETAIL_WIDTH = 70


def _figure(key: str, value) -> str | None:
    if value is None or value == [] or isinstance(value, dict):
        return None
    if isinstance(value, bool):
        return f"{key}={'yes' if value else 'no'}"
    if isinstance(value, float):
        return f"{key}={value!r}" if key in _FULL else f"{key}={g(value)}"
    if isinstance(value, list):
        if key == "bad_modules":
            return f"{key}={len(value)}"
        return f"{key}=" + few([g(v) if isinstance(v, float) else str(v) for v in value], 4, ",")
    return f"{key}={value}"


def figures_text(figures: dict) -> str:
    """``k=v`` pairs of the scalar figures worth a glance, one per line."""
    shown = [_figure(k, figures[k]) for k in _SHOWN if k in figures]
    return "\n".join(s for s in shown if s)


def render(result: Mapping[str, Any], width: int = DETAIL_WIDTH) -> str:
    """The verify table: check, PASS/FAIL, detail (wrapped), figures; then the verdict line."""
    rows = []
    for c in result["checks"]:
        detail = "\n".join(textwrap.wrap(c["detail"], width)) or "-"
        state = "NOT RUN" if c["passed"] is None else "PASS" if c["passed"] else "FAIL"
        rows.append([c["name"], state, detail, figures_text(c.get("figures", {}))])
    head = [f"verify {result.get('kind', '')}: {result['target']}".replace("  ", " ")]
    if result.get("dtype"):
        tol = result.get("tolerances") or {}
        head.append(f"output dtype {result['dtype']}; tolerances: update {g(tol.get('update'))} relative, "
                    f"survival {g(tol.get('survival'))}")
    failed = [c["name"] for c in result["checks"] if c["passed"] is False]
    skipped, n = [c["name"] for c in result["checks"] if c["passed"] is None], len(result["checks"])
    verdict = (f"FAILED: {len(failed)} of {n} checks ({', '.join(failed)})" if failed else
               f"PASSED: all {n} checks" if not skipped else f"PASSED: {n - len(skipped)} of {n} checks")
    if skipped:
        verdict += f"; NOT RUN: {len(skipped)} ({', '.join(skipped)}: see their rows)"
    note = f"\nnote: {result['not_independent']}" if result.get("not_independent") else ""
    return "\n".join(head) + "\n\n" + table(rows, ["check", "result", "detail", "figures"], "simple") + \
        "\n\n" + verdict + note
