"""What the spherical merges share: checks on their models, rows or columns of an update from its cores.

An update ``Qb C Qa^T`` has rows ``(Qb C)[j] Qa^T`` and columns ``Qb (C Qa^T)[:, j]``; the bases are
orthonormal, so row (column) norms and inner products of two updates are those of ``L = Qb C`` (``R = C Qa^T``),
and a per-row (per-column) combination stays factored: ``sum_i diag(c_i) L_i`` times ``Qa^T``
(``Qb`` times ``sum_i R_i diag(c_i)``), a LowRank of rank at most q (p).
"""

from __future__ import annotations


def no_weights(recipe, name: str) -> list[str]:
    """Problems for a method that takes no weights or densities (mergekit's model_stock, karcher, sce)."""
    p = []
    if any(e.get("weight", 1.0) != 1.0 for e in recipe.models or []):
        p.append(f"method={name}: takes no weights (mergekit's {name} weighs every model alike); drop them")
    if any(e.get("density") is not None for e in recipe.models or []):
        p.append(f"method={name}: takes no density; drop it from models")
    return p


def count_models(recipe, name: str, low: int, high: int | None = None) -> list[str]:
    n = len(recipe.models or [])
    if n < low or (high is not None and n > high):
        want = f"exactly {low}" if high == low else f"at least {low}"
        return [f"method={name}: merges {want} models, got {n}"]
    return []


def rows_of(x) -> list:
    """``[Qb C_i]`` (out, q) of the module's models: their updates' rows are these times ``Qa^T``."""
    return [m.space.left(m.C) for m in x.models]


def cols_of(x) -> list:
    """``[C_i Qa^T]`` (p, in) of the module's models: their updates' columns are ``Qb`` times these."""
    return [m.space.right(m.C) for m in x.models]


def from_rows(x, L):
    """``L Qa^T`` as a LowRank (rank q) for a combination ``L`` (out, q) of the rows."""
    import torch

    from ..linalg.lowrank import LowRank

    space = x.models[0].space
    return LowRank(L, space.right(torch.eye(space.q, dtype=L.dtype, device=L.device)), 1.0)


def from_cols(x, R):
    """``Qb R`` as a LowRank (rank p) for a combination ``R`` (p, in) of the columns."""
    import torch

    from ..linalg.lowrank import LowRank

    space = x.models[0].space
    return LowRank(space.left(torch.eye(space.p, dtype=R.dtype, device=R.device)), R, 1.0)
