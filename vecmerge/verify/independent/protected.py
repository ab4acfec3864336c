"""verify's own re-derivation of a protected step (numpy float64; no pipeline, analysis or linalg code).

Given every protected set's Grams ``G_k`` per module (``verify.checks.protected_capture``), ``G = sum_k G_k``, its
eigendecomposition by ``numpy.linalg.eigh``, ``U`` the fewest top eigenvectors holding the share E of the trace,
and ``dir'_m (I - U U^T)`` (``derive``). The figures recompute as quadratic forms on verify's stacks:
``||D X^T||_F^2 = sum((B^T B) * (A G A^T))``, ``kept_drift_k``, ``kept_change_t`` and ``kept_direction`` as ratios,
the rank of each ``U_m``, the prompt files' sha256 and E; every one must match the manifest's ``protection``.
"""

from __future__ import annotations

import math

import numpy as np

from ..report import check, close

ZERO_EIG = 1e-12   # eigenvalues below this share of the largest are round-off
SKETCH_RTOL = 1e-3  # a sketch's bound: its shrinkage follows the float32 rows (batched there, item by item here)
FIGURE_RTOL = 1e-4  # the capture runs the model in float32, item by item (the step batched): figures agree to ~1e-6


def energy_basis(G: np.ndarray, energy: float) -> np.ndarray:
    """U: the fewest top eigenvectors of G whose eigenvalues sum to at least ``energy`` of the trace (numpy eigh)."""
    w, V = np.linalg.eigh(G)
    w, V = w[::-1], V[:, ::-1]
    if not w.size or not w[0] > 0:
        return V[:, :0]
    w = np.where(w > ZERO_EIG * w[0], w, 0.0)
    cum = np.cumsum(w)
    c = int(np.searchsorted(cum, energy * cum[-1] * (1 - 1e-12))) + 1
    return np.ascontiguousarray(V[:, :min(c, int((w > 0).sum()))])


def quadratic(B: np.ndarray, A: np.ndarray, G: np.ndarray) -> float:
    """``||B A X^T||_F^2 = sum((B^T B) * (A G A^T))`` for ``G = X^T X``."""
    return float(((B.T @ B) * (A @ G @ A.T)).sum())


def protector(recipe: dict, capture):
    """``(protector, state)``: ``protector(d)`` captures the Grams with ``d``'s backbone (``capture(backbone,
    modules)``) and returns ``{module: U}``; ``state`` keeps the Grams and sets for ``protection_check``."""
    state: dict = {}

    def protect(d) -> dict:
        selected = [m for m in d.names if _selected(recipe, m)]
        backbone = {}
        for m in d.names:
            b = d.operand("base", m)
            backbone[m] = (b.B, b.A)
        grams, sets = capture(backbone, selected)
        state.update(grams=grams, sets=sets)
        energy = float((recipe.get("protect_energy") or [0.9])[0])
        names = list(recipe["protect"])
        out = {}
        for m in selected:
            if all(m in grams[k] for k in names):
                out[m] = energy_basis(sum(grams[k][m] for k in names), energy)
        return out

    return protect, state


def _sketches(recorded: dict, mine: dict, problems: list) -> None:
    """The sketched inputs the manifest records (``inputs.sketched``: module -> set -> rows, bound) against verify's
    own Frequent Directions run (``mine``: set -> module -> rows, bound)."""
    theirs = (recorded.get("inputs") or {}).get("sketched") or {}
    want = {(m, k): v for k, mods in mine.items() for m, v in mods.items()}
    got = {(m, k): v for m, sets in theirs.items() for k, v in (sets or {}).items()}
    if set(want) != set(got):
        problems.append(f"protection.inputs.sketched names {len(got)} input(s), verify's own capture sketched "
                        f"{len(want)}")
        return
    for (m, k), v in want.items():
        bound = got[(m, k)].get("bound") if isinstance(got[(m, k)], dict) else None
        if not isinstance(bound, (int, float)) or not close(v["bound"], bound, SKETCH_RTOL, 1e-9):
            problems.append(f"protection.inputs.sketched.{m}.{k}.bound is {bound!r}, verify's own sketch gives "
                            f"{v['bound']!r}")


def _selected(recipe: dict, m: str) -> bool:
    import re

    only, excl = recipe.get("only"), recipe.get("exclude")
    return (only is None or re.search(only, m) is not None) and not (excl is not None and re.search(excl, m))


def protection_check(d, recipe: dict, recorded: dict | None, state: dict) -> dict:
    """Every figure of the manifest's ``protection`` against verify's own: ranks, kept_*, sha256, energy."""
    if not isinstance(recorded, dict):
        return check("protection", False, "the manifest records no protection section for a protected recipe")
    grams, sets = state["grams"], state["sets"]
    sums: dict = {k: [0.0, 0.0] for k in grams}
    dn2 = dp2 = 0.0
    ranks = {}
    for m, U in d.protect.items():
        base, direction = d.operand("base", m), d.operand("dir", m)
        if d.coeff.get(m) is None:
            continue
        whole = d.stepped_dir(m, base, direction, protected=False)
        kept = d.stepped_dir(m, base, direction)
        if whole.norm() == 0.0:
            continue
        ranks[m] = int(U.shape[1])
        dn2 += whole.norm() ** 2
        dp2 += kept.norm() ** 2
        for k, g in grams.items():
            sums[k][0] += quadratic(kept.B, kept.A, g[m])
            sums[k][1] += quadratic(whole.B, whole.A, g[m])
    problems = []

    def compare(what: str, mine, theirs, rtol: float = FIGURE_RTOL) -> None:
        if not isinstance(theirs, (int, float)) or mine is None or not close(mine, theirs, rtol, 1e-12):
            problems.append(f"{what} is {theirs!r}, recomputes to {mine!r}")

    energy = float((recipe.get("protect_energy") or [0.9])[0])
    compare("protection.energy", energy, recorded.get("energy"), 0.0)
    compare("protection.kept_direction", math.sqrt(dp2 / dn2) if dn2 else None, recorded.get("kept_direction"))
    for role, figure in (("protect", "kept_drift"), ("target", "kept_change")):
        for k, entry in (recorded.get(role) or {}).items():
            if k not in sums:
                problems.append(f"protection.{role}.{k} is not a set of the recipe")
                continue
            kept, whole = sums[k]
            compare(f"protection.{role}.{k}.{figure}", math.sqrt(kept / whole) if whole > 0 else None,
                    entry.get(figure))
            if entry.get("sha256") != sets[k].sha256:
                problems.append(f"protection.{role}.{k}.sha256 is {str(entry.get('sha256'))[:16]}..., the prompt file "
                                f"{sets[k].path} hashes to {sets[k].sha256[:16]}...")
    _sketches(recorded, state.get("sketched") or {}, problems)
    rec_ranks = recorded.get("ranks") or {}
    off = [m for m in ranks if rec_ranks.get(m) != ranks[m]] + [m for m in rec_ranks if m not in ranks]
    if off:
        problems.append(f"protection.ranks differ in {len(off)} module(s), e.g. {off[0]}: recorded "
                        f"{rec_ranks.get(off[0])!r}, recomputed {ranks.get(off[0])!r}")
    return check("protection", not problems, "; ".join(problems[:4]) or
                 f"re-derived with verify's own hooks and numpy eigh: U ranks of {len(ranks)} module(s), "
                 f"kept_direction, kept_drift and kept_change as recorded (rel {FIGURE_RTOL:g}), prompt files as "
                 "pinned", {"modules": len(ranks)})
