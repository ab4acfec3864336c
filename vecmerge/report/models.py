"""Rendering ``vecmerge extract`` and ``vecmerge fuse``: what was written, how much survived, what else differed.

Both take the command's manifest (``vecmerge.json`` content); ``--json`` prints the manifest itself.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ..errors import few
from .format import g, table


def _natural(name: str) -> list:
    """``layers.10`` after ``layers.9``: digit runs compared as numbers."""
    return [(0, int(p), "") if p.isdigit() else (1, 0, p) for p in re.split(r"(\d+)", name)]


def _by_type(modules: dict) -> list[list]:
    groups: dict = {}
    for m, r in modules.items():
        groups.setdefault(m.rsplit(".", 1)[-1], []).append(r)
    rows = []
    for t, rs in sorted(groups.items()):
        tot = sum(r["total_energy"] for r in rs)
        drop = sum(r["dropped_energy"] for r in rs)
        ranks = [r["rank"] for r in rs]
        rows.append([t, len(rs), f"{min(ranks)}..{max(ranks)}", g(1 - drop / tot if tot > 0 else 1.0, 6),
                     g(max(r["rel_error"] for r in rs)), "/".join(sorted({r["method"] for r in rs}))])
    return rows


def render_extract(man: Mapping[str, Any], show_modules: bool = False) -> str:
    """Summary lines, a table by module type (kept share of ||D||^2, worst relative error), the others."""
    fig, s, oth = man["figures"], man["settings"], man["others"]
    lines = [f"extract: {man['inputs']['tuned']['path']} - {man['inputs']['base']['path']} -> {man.get('out')}",
             f"rank {s['rank']}: {fig['modules']} modules, ranks {fig['rank']['min']}..{fig['rank']['max']} "
             f"({fig['rank']['sum']} in all); kept share {g(fig['kept_share'], 6)} of the update's squared norm, "
             f"relative error {g(fig['rel_error'])} (worst {fig['worst_module']}: {g(fig['max_rel_error'])})"]
    if s["rank"].startswith("energy"):
        lines.append(f"energy: {fig['minimal']}/{fig['modules']} ranks certified minimal"
                     + (" (the others lie within their recorded [rank_lower_bound, rank])"
                        if fig["minimal"] < fig["modules"] else ""))
    if s["rank"] == "auto":
        sig = [r["sigma"] for r in man["modules"].values() if r.get("sigma") is not None]
        lines.append(f"auto: kept singular values above the Gavish-Donoho threshold for a noise level sigma estimated "
                     f"per module (sigma {g(min(sig, default=0))}..{g(max(sig, default=0))})")
    rows = _by_type(man["modules"])
    lines += ["", table(rows, ["type", "modules", "ranks", "kept share", "max rel error", "method"])]
    tensors = oth["tensors"]
    if not tensors and all(r["total_energy"] == 0 for r in man["modules"].values()):
        lines.append("\nwarning: --tuned equals --base-model in every tensor, so the adapter is zero and changes "
                     "nothing; check --tuned")
    if not tensors:
        lines.append("\nothers: every tensor outside --targets is identical in both models")
    else:
        kinds: dict = {}
        for t in tensors:
            kinds.setdefault(t["kind"], []).append(t["tensor"])
        what = ", ".join(f"{len(v)} {k}" for k, v in kinds.items())
        done = (f"saved whole as modules_to_save ({len(oth['saved_modules'])} modules: {few(oth['saved_modules'], 4)})"
                if oth["policy"] == "save" else "DROPPED (not in the adapter)")
        lines.append(f"\nothers: {len(tensors)} tensors outside --targets differ ({what}): {done}")
        rows = [[t["tensor"], t["kind"], t["base_shape"] and "x".join(map(str, t["base_shape"])),
                 t["tuned_shape"] and "x".join(map(str, t["tuned_shape"])), g(t["rel_change"])] for t in tensors[:12]]
        lines.append(table(rows, ["tensor", "kind", "base", "tuned", "rel change"]))
        if len(tensors) > 12:
            lines.append(f"... and {len(tensors) - 12} more (vecmerge.json lists them all)")
        if kinds.get("resized") and oth["policy"] == "save":
            lines.append("the vocabulary was resized: resize the base's token embeddings before loading the adapter "
                         "(model.resize_token_embeddings); the fine-tune's tokenizer files are in the folder")
    if show_modules:
        rows = [[m, r["rank"], g(r["kept_share"], 6), g(r["rel_error"]), r["method"], r["power_iters"]]
                for m, r in sorted(man["modules"].items(), key=lambda kv: _natural(kv[0]))]
        lines += ["", table(rows, ["module", "rank", "kept share", "rel error", "method", "power iters"])]
    lines.append(f"\nwrote {man.get('out')} in {g(fig.get('seconds'), 3)} s; check it with: vecmerge verify "
                 f"{man.get('out')}")
    return "\n".join(lines)


def render_fuse(man: Mapping[str, Any]) -> str:
    """What was fused, replaced, copied and how far rounding moved the update."""
    fig, out = man["figures"], man["output"]
    dtype = man["settings"]["dtype"] or "each tensor's stored dtype"
    worst = max(man["modules"], key=lambda m: man["modules"][m]["rounding_rel"], default=None)
    lines = [f"fuse: {man['inputs']['adapter']['path']} into {man['inputs']['base']['path']} -> {man.get('out')}",
             f"{fig['modules']} modules updated (W + scale * B @ A, rounded once to {dtype}); "
             f"{fig['saved']} tensors replaced by the adapter's modules_to_save; {fig['copied']} copied byte for "
             f"byte, {fig['converted']} converted",
             f"rounding moved the update by {g(fig['rounding_rel'])} of its norm (worst {worst}: "
             f"{g(fig['max_rounding_rel'])})",
             f"files: {few(list(out['files']), 4)}; copied: {few(out['copied_files'], 6)}"
             + (f"; config.json edited: {out['config_edits']}" if out["config_edits"] else ""),
             f"\nwrote {man.get('out')} in {g(fig.get('seconds'), 3)} s; check it with: vecmerge verify "
             f"{man.get('out')}"]
    return "\n".join(lines)
