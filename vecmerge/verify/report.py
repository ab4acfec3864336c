"""Check records: the one JSON-ready shape every verification result takes.

``check(name, passed, detail, figures)`` is one row of ``vecmerge verify``'s table; ``result`` gathers
rows into a verdict (passed only when every row passed), a typed ``VerifyReport`` that reads as its JSON.
A check that could not run is a failure with its reason (``not_run``): no check passes by default, and none
passes on NaN (``within``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

from ..results import OPTIONAL, Result, json_field


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


@dataclass(frozen=True, eq=False)
class VerifyReport(Result):
    """``vecmerge verify``'s verdict (``--json``: ``to_dict()``): ``{target, passed, checks, kind, ...}``.

    Args:
        target (str): the output folder, or the adapters' labels joined by "; " (identities).
        passed (bool): every check passed. checks (list[dict]): the rows (``check``).
        kind (str | None): output | identities | extract output | fuse output.
        dtype (str | None): the output's dtype (None: each tensor kept its stored dtype, a fuse without
            --dtype); printed, null or not, whenever ``tolerances`` is.
        tolerances (dict | None): the bounds the checks used. recipe (dict | None): base, dir, rank, multiple.
        adapters (list[str] | None): the adapters' folders (identities).
        extra (dict): any further keys (``not_independent``), printed after the others in their order.
    """

    target: str
    passed: bool
    checks: list
    kind: str | None = json_field(optional=True, default=None)
    dtype: str | None = json_field(optional=True, default=None)
    tolerances: dict | None = json_field(optional=True, default=None)
    recipe: dict | None = json_field(optional=True, default=None)
    adapters: list | None = json_field(optional=True, default=None)
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "extra" or (value is None and f.metadata.get(OPTIONAL)
                                     and not (f.name == "dtype" and self.tolerances is not None)):
                continue
            out[f.name] = value
        return {**out, **self.extra}


def result(target: str, checks: list[dict], **extra) -> VerifyReport:
    """``VerifyReport`` ``{target, passed, checks, ...}``: passed when every check passed; known keys (kind,
    dtype, tolerances, recipe, adapters) become fields, any other keyword an extra key of the JSON."""
    known = {k: extra.pop(k) for k in ("kind", "dtype", "tolerances", "recipe", "adapters") if k in extra}
    return VerifyReport(target, all(c["passed"] for c in checks), checks, **known, extra=extra)


def within(value: float, tol: float) -> bool:
    """``value <= tol`` for a finite value; NaN and infinities never pass."""
    return isinstance(value, (int, float)) and math.isfinite(value) and value <= tol


def close(a: float, b: float, rtol: float, atol: float = 1e-12) -> bool:
    """``|a - b| <= atol + rtol |b|`` for finite a and b; False on NaN or infinities."""
    return math.isfinite(a) and math.isfinite(b) and abs(a - b) <= atol + rtol * abs(b)
