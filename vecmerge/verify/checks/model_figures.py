"""The ``figures`` row of ``vecmerge verify`` for extract and fuse outputs: every number of the manifest accounted for.

Each recorded number is recomputed here from what ``verify.checks.models`` measured on the models and the written
weights (float64), or, for a total, from the per-module values it sums once those are checked; the detail
names the field that differs (``modules.q_proj.delta_norm is 9.1, recomputes to 6.08``). Tolerances:

- fuse: ``delta_norm`` (``||scale B A||`` from the adapter, float64 both sides) within ``FIGURES_RTOL``;
  ``rounding_rel`` and the ``figures`` built from it within ``TOLERANCES[dtype]["update"]`` relative, the dtype
  being the tensor's stored one (the writer sums in float32 for bf16 and fp16, verify in float64: they differ
  by far less); counts exactly.
- extract: ``total_energy`` (``||W_tuned - W_base||^2``) within ``FIGURES_RTOL``; ``sqrt(dropped_energy /
  total_energy)`` within ``TOLERANCES[dtype]["update"]`` of the written factors' error (as ``update`` judges
  ``rel_error``); ``rel_error``, ``kept_share`` and every ``figures`` entry equal (``FIGURES_RTOL``) to what the
  per-module energies give; ``rank`` the stored one (a zero cut stores rank 1); counts exactly.
- ``seconds`` (a timing) and the cut's bookkeeping (``method``, ``power_iters``, ``rank_lower_bound``,
  ``minimal``, ``sigma``, ``threshold``) are checked for type only: they do not recompute from the files.
  A key vecmerge does not write fails.
"""

from __future__ import annotations

import math
from typing import Any, TypeGuard

from ...outputs.manifest import TOLERANCES
from ..report import check
from .files import FIGURES_RTOL, SHOWN, differences

FUSE_MODULE_KEYS = ("tensor", "shape", "delta_norm", "rounding_rel")
FUSE_FIGURES = ("modules", "saved", "copied", "converted", "tensors", "max_rounding_rel", "rounding_rel", "seconds")
EXTRACT_MODULE_KEYS = ("kind", "shape", "rank", "method", "power_iters", "total_energy", "dropped_energy",
                       "kept_share", "rel_error", "seconds", "alpha", "written_rank", "rank_lower_bound", "minimal",
                       "sigma", "threshold")
EXTRACT_FIGURES = ("modules", "rank", "total_energy", "dropped_energy", "kept_share", "rel_error", "worst_module",
                   "max_rel_error", "minimal", "others", "saved_modules", "seconds")
_UNCHECKED: dict[str, Any] = {"seconds": (int, float), "method": str, "power_iters": int, "rank_lower_bound": int,
                              "minimal": bool, "sigma": (int, float, type(None)),
                              "threshold": (int, float, type(None))}


def _number(x) -> TypeGuard[float]:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _rtol(dtype: str | None) -> float:
    return TOLERANCES.get(dtype or "fp32", TOLERANCES["bf16"])["update"]


def _unknown_and_typed(rec, where: str, known: tuple) -> list[str]:
    if not isinstance(rec, dict):
        return [f"{where} is not a mapping"]
    off = [f"{where}.{k} is not a field vecmerge writes" for k in rec if k not in known]
    for k, kind in _UNCHECKED.items():  # in figures only seconds: its other keys are recomputed (minimal: a count)
        if k not in rec or (where == "figures" and k != "seconds"):
            continue
        if not isinstance(rec[k], kind) or (kind is int and isinstance(rec[k], bool)):
            off.append(f"{where}.{k} is {rec[k]!r}, not of the type vecmerge writes here")
    if isinstance(rec.get("seconds"), (int, float)) and not rec["seconds"] >= 0:
        off.append(f"{where}.seconds is {rec['seconds']!r}, not a duration")
    return off


def _row(off: list[str], ok_detail: str) -> dict:
    more = f" and {len(off) - SHOWN} more" if len(off) > SHOWN else ""
    return check("figures", not off, "; ".join(off[:SHOWN]) + more if off else ok_detail, {"differing": off[:20]})


def fuse_figures(man: dict, measured: dict, counts: dict) -> dict:
    """The ``figures`` check of a fuse output.

    Args:
        man (dict): vecmerge.json. measured (dict): per fused module ``{tensor, shape, d_sq, e_sq, dtype}``
            (``||D||^2`` and ``||out - (W + D)||^2`` in float64; dtype fp32 | bf16 | fp16 of the written tensor).
        counts (dict): ``{modules, saved, copied, converted, tensors}`` counted in the output against the base.
    """
    mods, figs, off = man.get("modules") or {}, man.get("figures"), []
    rels = {}
    for m, got in measured.items():
        rec, where = mods.get(m), f"modules.{m}"
        off += _unknown_and_typed(rec, where, FUSE_MODULE_KEYS)
        if not isinstance(rec, dict):
            continue
        d = math.sqrt(got["d_sq"])
        rels[m] = math.sqrt(got["e_sq"] / got["d_sq"]) if got["d_sq"] > 0 else math.sqrt(got["e_sq"])
        want = {"tensor": got["tensor"], "shape": got["shape"], "delta_norm": d}
        off += differences(want, {k: rec.get(k) for k in want}, where, FIGURES_RTOL)
        off += differences(rels[m], rec.get("rounding_rel"), f"{where}.rounding_rel", _rtol(got["dtype"]))
    off += _unknown_and_typed(figs, "figures", FUSE_FIGURES)
    if isinstance(figs, dict):
        off += differences({k: counts[k] for k in ("modules", "saved", "copied", "converted", "tensors")},
                           {k: figs.get(k) for k in ("modules", "saved", "copied", "converted", "tensors")}, "figures")
        worst_dtype = max((g["dtype"] for g in measured.values()), key=_rtol, default=None)
        d_all = sum(g["d_sq"] for g in measured.values())
        e_all = sum(g["e_sq"] for g in measured.values())
        off += differences(max(rels.values(), default=0.0), figs.get("max_rounding_rel"), "figures.max_rounding_rel",
                           _rtol(worst_dtype))
        off += differences(math.sqrt(e_all / d_all) if d_all > 0 else 0.0, figs.get("rounding_rel"),
                           "figures.rounding_rel", _rtol(worst_dtype))
    return _row(off, f"every figure of figures and modules ({len(measured)}) recomputes from the base and the "
                f"adapter (delta_norm rtol {FIGURES_RTOL:g}, rounding_rel rtol of its dtype's update tolerance; "
                "seconds not recomputable)")


def extract_figures(man: dict, measured: dict, ranks: dict, others: int, dtype: str | None) -> dict:
    """The ``figures`` check of an extract output.

    Args:
        man (dict): vecmerge.json. measured (dict): per module ``(||D||^2, ||D - W||/||D||)`` in float64, from
            both models and the written factors. ranks (dict): per module the stored rank.
        others (int): the differing tensors outside the targets, listed again. dtype (str | None): the factors'.
    """
    mods, figs, off, tol = man.get("modules") or {}, man.get("figures"), [], _rtol(dtype)
    for m, (total, rel) in measured.items():
        rec, where = mods.get(m), f"modules.{m}"
        off += _unknown_and_typed(rec, where, EXTRACT_MODULE_KEYS)
        if not isinstance(rec, dict):
            continue
        off += differences(total, rec.get("total_energy"), f"{where}.total_energy", FIGURES_RTOL)
        t, d = rec.get("total_energy"), rec.get("dropped_energy")
        if not (_number(t) and _number(d) and 0 <= d <= t * (1 + FIGURES_RTOL)):
            off.append(f"{where}.dropped_energy is {d!r}, not an energy between 0 and total_energy {t!r}")
            continue
        cut = math.sqrt(min(d / t, 1.0)) if t > 0 else 0.0
        if abs(cut - rel) > tol:
            off.append(f"{where}.dropped_energy is {d!r}: sqrt(dropped / total) = {cut:.6g}, the written factors' "
                       f"error is {rel:.6g} (tolerance {tol:g})")
        off += differences(cut, rec.get("rel_error"), f"{where}.rel_error", FIGURES_RTOL)
        off += differences(1 - d / t if t > 0 else 1.0, rec.get("kept_share"), f"{where}.kept_share", FIGURES_RTOL)
        r = rec.get("rank")
        if not (isinstance(r, int) and (r == ranks.get(m) or (r == 0 and ranks.get(m) == 1))):
            off.append(f"{where}.rank is {r!r}, the output stores rank {ranks.get(m)}")
    off += _unknown_and_typed(figs, "figures", EXTRACT_FIGURES)
    good = all(isinstance(mods.get(m), dict) and _number(mods[m].get(k)) for m in measured
               for k in ("total_energy", "dropped_energy", "rel_error")) and all(
        isinstance(mods.get(m, {}).get("rank"), int) for m in measured)
    if isinstance(figs, dict) and good:
        recs = {m: mods[m] for m in measured}
        tot = sum(r["total_energy"] for r in recs.values())
        drop = sum(r["dropped_energy"] for r in recs.values())
        ranks_ = [r["rank"] for r in recs.values()] or [0]
        worst = max(recs, key=lambda m: recs[m]["rel_error"], default=None)
        want = {"modules": len(measured), "rank": {"min": min(ranks_), "max": max(ranks_), "sum": sum(ranks_)},
                "total_energy": tot, "dropped_energy": drop, "kept_share": 1 - drop / tot if tot > 0 else 1.0,
                "rel_error": math.sqrt(drop / tot) if tot > 0 else 0.0, "worst_module": worst,
                "max_rel_error": recs[worst]["rel_error"] if worst else 0.0,
                "minimal": sum(1 for r in recs.values() if r.get("minimal")), "others": others,
                "saved_modules": len((man.get("others") or {}).get("saved_modules") or [])}
        off += differences(want, {k: figs.get(k) for k in want}, "figures", FIGURES_RTOL)
    return _row(off, f"every figure of figures and modules ({len(measured)}) recomputes from both models and the "
                f"written factors (energies rtol {FIGURES_RTOL:g}, the cut's error within {tol:g}; seconds and the "
                "cut's bookkeeping checked for type only)")
