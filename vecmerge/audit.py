"""Per-module agreement between a reference trajectory and a direction: inner product, cosine, sign.

For modules m: ``inner_m = <ref_m, dir_m>_F`` (factored), ``cos_m = inner_m / (||ref_m|| ||dir_m||)``;
the module *agrees* when ``inner_m > 0``. ``agree_energy`` is the share of ``||dir||^2`` that lies in
agreeing modules.
"""

from __future__ import annotations

import statistics

from .adapter import module_layer, module_type
from .taskvector import TaskVector


def agreement_rows(ref: TaskVector, direction: TaskVector, names: list[str] | None = None,
                   progress=None) -> list[dict]:
    """One row per module: ``module, layer, type, inner, cosine, ref_norm, dir_norm, agree``.

    Args:
        ref (TaskVector): the reference trajectory, e.g. ``v54 - v54e2``.
        direction (TaskVector): the proposed direction, e.g. ``v51 - v28``.
        names (list[str] | None): modules to audit (default: the direction's).
        progress: optional callable wrapping the module iterable (a tqdm bar).
    """
    names = names if names is not None else direction.names()
    it = progress(names) if progress else names
    rows = []
    for m in it:
        r, d = ref[m], direction[m]
        rn, dn = r.norm(), d.norm()
        inner = r.inner(d)
        cos = inner / (rn * dn) if rn > 0 and dn > 0 else 0.0
        rows.append({"module": m, "layer": module_layer(m), "type": module_type(m), "inner": inner,
                     "cosine": cos, "ref_norm": rn, "dir_norm": dn, "agree": inner > 0})
    return rows


def summarize(rows: list[dict]) -> dict:
    """``modules, agree, disagree, agree_energy, cosine_median, cosine_min, disagreeing``."""
    energy = sum(r["dir_norm"] ** 2 for r in rows)
    agree_energy = sum(r["dir_norm"] ** 2 for r in rows if r["agree"])
    cos = [r["cosine"] for r in rows]
    return {
        "modules": len(rows),
        "agree": sum(r["agree"] for r in rows),
        "disagree": sum(not r["agree"] for r in rows),
        "agree_energy": agree_energy / energy if energy > 0 else 0.0,
        "cosine_median": statistics.median(cos) if cos else 0.0,
        "cosine_min": min(cos) if cos else 0.0,
        "disagreeing": [r["module"] for r in rows if not r["agree"]],
    }
