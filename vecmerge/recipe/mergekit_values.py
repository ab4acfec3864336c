"""The values of a mergekit file checked one by one: numbers, layer ranges, and parameter settings.

A mergekit parameter setting (``mergekit.config.ParameterSetting``) is a scalar, a gradient (a list of
scalars interpolated over the layers), or filters (``{filter, value}`` mappings, or a list of them: the first
whose ``filter`` is a substring of the module's name, or has none, gives the value; each value a scalar or a
gradient). ``setting`` reads one as a list of conditions ``[(filter | None, [values])]``; ``per_layer`` turns
it into ``[(module pattern, value)]`` rows (``per_module`` of a recipe), with mergekit's interpolation: in a
slice of ``n`` layers the layer at offset ``i`` takes ``t = i / (n - 1)`` (``t = 1`` for one layer), and a
gradient of ``k`` values gives ``v[j] (1 - f) + v[j + 1] f`` with ``j + f = t (k - 1)``. Every bad value is one
problem naming its place and the fix. This module imports no torch.
"""

from __future__ import annotations

import math
import re
from typing import Any, TypeGuard

Scalar = Any  # a YAML scalar of a setting: a number (every value of a gradient), or a boolean or text alone
Conditions = list[tuple[str | None, list[Scalar]]]  # ``setting``'s ``[(filter | None, [values])]``
Row = tuple[str, Scalar]  # ``(module pattern, value)``: one ``per_module`` row

MAX_LAYERS = 4096  # no model has more; a layer_range beyond it is refused before anything is built


def real(v: object) -> TypeGuard[float]:
    """A finite number that is not a boolean (an integer too large for a float is not finite)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    try:
        return math.isfinite(float(v))
    except OverflowError:
        return False


def shown(v: object, n: int = 40) -> str:
    """A value for a message, cut to ``n`` characters (a weight of 100k digits stays one short line)."""
    text = repr(v) if not isinstance(v, int) or isinstance(v, bool) or abs(v) < 10**30 else "an integer of " \
        f"{len(str(abs(v))) if abs(v) < 10**4000 else 'thousands of'} digits"
    return text if len(text) <= n else text[:n] + "..."


def _scalar_ok(v: object) -> bool:
    return isinstance(v, (bool, str)) or real(v)


def setting(value: object, where: str, problems: list[str]) -> Conditions | None:
    """A parameter setting as conditions ``[(filter | None, [values])]`` (one value: a scalar), or None.

    Args:
        value: the YAML value. where (str): its place, e.g. ``parameters.t``. problems (list[str]): appended to.
    """
    if isinstance(value, dict):
        value = [value]
    if _scalar_ok(value):
        return [(None, [value])]
    if not isinstance(value, list) or not value:
        problems.append(f"{where}={shown(value)}: a number, a gradient (a list of numbers over the layers) or "
                        "filters ([{filter: mlp, value: 0.5}, {value: 1}])")
        return None
    if all(not isinstance(e, (dict, list)) for e in value):
        bad = [e for e in value if not real(e)]
        if bad:
            problems.append(f"{where}: a gradient is a list of numbers ({shown(bad[0])} is not one)")
            return None
        return [(None, list(value))]
    conds: Conditions = []
    for j, c in enumerate(value):
        if not isinstance(c, dict) or "value" not in c or set(c) - {"filter", "value"}:
            problems.append(f"{where}[{j}]: a filter is a mapping {{filter: NAME-PART, value: ...}} ({{value: ...}} "
                            "alone for the rest); a list of mappings is filters, a list of numbers a gradient")
            return None
        f = c.get("filter")
        if f is not None and not isinstance(f, str):
            problems.append(f"{where}[{j}].filter={shown(f)}: a part of a module name, e.g. mlp or self_attn")
            return None
        inner = setting(c["value"], f"{where}[{j}].value", problems)
        if inner is None:
            return None
        if len(inner) != 1 or inner[0][0] is not None:
            problems.append(f"{where}[{j}].value: a number or a gradient (filters do not nest)")
            return None
        conds.append((None if f in (None, "*") else f, inner[0][1]))
    return conds


def constant(conds: Conditions) -> Scalar | None:
    """The one value of a setting that is the same everywhere (a scalar, no filter), else None."""
    return conds[0][1][0] if len(conds) == 1 and conds[0][0] is None and len(conds[0][1]) == 1 else None


def at(values: list[float], t: float) -> float:
    """mergekit's value of a gradient at ``t`` in [0, 1] (a single value: itself)."""
    if len(values) == 1:
        return values[0]
    scaled = t * (len(values) - 1)
    i0 = int(scaled)
    i1 = min(len(values) - 1, i0 + 1)
    frac = scaled - i0
    return (1 - frac) * values[i0] + frac * values[i1]


def layer_pattern(layer: int) -> str:
    """The module-name pattern of one layer (``re.search``), as ``only`` spells it."""
    return rf"(^|\.)layers\.{layer}\."


def per_layer(conds: Conditions, slices: list[tuple[int, int]]) -> list[Row]:
    """``[(pattern, value)]``: the setting resolved per layer of each slice and per filter, first match first.

    Args:
        conds (list): from ``setting``. slices (list[tuple[int, int]]): the ``[start, end)`` layer ranges.
    """
    rows: list[Row] = []
    for a, b in slices:
        n = b - a
        for i in range(n):
            t = i / (n - 1) if n > 1 else 1.0
            for f, values in conds:
                where = layer_pattern(a + i) if f is None else rf"^(?=.*{re.escape(f)})(.*\.)?layers\.{a + i}\."
                rows.append((where, at(values, t)))
    for f, values in conds:  # modules outside any layer: mergekit's t = 0
        rows.append((".*" if f is None else re.escape(f), values[0]))
    return rows


def layer_range(raw: object, where: str, problems: list[str]) -> tuple[int, int] | None:
    """``(start, end)`` of a ``layer_range: [start, end]`` with integers ``0 <= start < end <= MAX_LAYERS``."""
    if not isinstance(raw, (list, tuple)) or len(raw) != 2 or not all(
            isinstance(x, int) and not isinstance(x, bool) for x in raw):
        problems.append(f"{where}={shown(raw)}: two whole numbers [start, end] (e.g. [0, 28]), not booleans, "
                        "lists or one number")
        return None
    a: int = raw[0]
    b: int = raw[1]
    if not 0 <= a < b:
        problems.append(f"{where}=[{shown(a)}, {shown(b)}]: 0 <= start < end")
        return None
    if b > MAX_LAYERS:
        problems.append(f"{where}=[{a}, {shown(b)}]: end beyond {MAX_LAYERS} layers; give the model's layers "
                        "(e.g. [0, 28] for a 28-layer model)")
        return None
    return a, b
