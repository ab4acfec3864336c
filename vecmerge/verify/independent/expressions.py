"""Linear expressions over adapter names (``v54 + 0.12*(v51 - v28)``) read by Python's own ``ast``, for
``verify.independent.derive``: the pipeline's parser (``vecmerge.expr``) is what verify must not share."""

from __future__ import annotations

import ast

from .references import Uncovered

MAX_NODES = 2000


def coefficients(expr: str) -> dict[str, float]:
    """``{name: c}`` of a linear expression over adapter names, read by Python's ``ast`` (names may hold dots)."""
    tree = ast.parse(expr.strip(), mode="eval")
    if sum(1 for _ in ast.walk(tree)) > MAX_NODES:
        raise Uncovered(f"expression {expr[:40]!r} is too long")

    def name(node) -> str | None:
        if isinstance(node, ast.Name):
            return node.id
        if isinstance(node, ast.Attribute):
            head = name(node.value)
            return None if head is None else f"{head}.{node.attr}"
        return None

    def ev(node):  # -> (coeffs, const): exactly one of them is set
        n = name(node)
        if n is not None:
            return {n: 1.0}, None
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value,
                                                                                                     bool):
            return None, float(node.value)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            c, k = ev(node.operand)
            s = -1.0 if isinstance(node.op, ast.USub) else 1.0
            return ({n: s * v for n, v in c.items()}, None) if c is not None else (None, s * k)
        if isinstance(node, ast.BinOp):
            (lc, lk), (rc, rk) = ev(node.left), ev(node.right)
            if isinstance(node.op, (ast.Add, ast.Sub)):
                s = 1.0 if isinstance(node.op, ast.Add) else -1.0
                if lc is None or rc is None:
                    raise Uncovered(f"expression {expr!r} adds a number to an adapter")
                out = dict(lc)
                for n, v in rc.items():
                    out[n] = out.get(n, 0.0) + s * v
                return out, None
            if isinstance(node.op, ast.Mult) and (lk is None) != (rk is None):
                c, k = (lc, rk) if lk is None else (rc, lk)
                return {n: v * k for n, v in c.items()}, None
            if isinstance(node.op, ast.Div) and lc is not None and rk is not None and rk != 0:
                return {n: v / rk for n, v in lc.items()}, None
            if lk is not None and rk is not None and isinstance(node.op, ast.Mult):
                return None, lk * rk
            if lk is not None and rk is not None and isinstance(node.op, ast.Div) and rk != 0:
                return None, lk / rk
        raise Uncovered(f"expression {expr!r}: {ast.dump(node)[:40]} is not linear in the adapters")

    coeffs, const = ev(tree.body)
    if coeffs is None:
        raise Uncovered(f"expression {expr!r} names no adapter")
    return coeffs
