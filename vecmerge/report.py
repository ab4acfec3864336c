"""Text rendering of reports: tables for people, JSON for machines. Only this layer uses tabulate.

Floats that a user may paste into a recipe (alpha) are printed with ``repr``: the shortest string
that reads back to the same float64, i.e. full precision.
"""

from __future__ import annotations

import json

from tabulate import tabulate

from .export import jsonable


def table(rows: list, headers: list, fmt: str = "simple") -> str:
    """A tabulate table (``simple``, ``github`` for markdown, ...)."""
    if not any(headers):
        return tabulate(rows, tablefmt=fmt, disable_numparse=True)
    return tabulate(rows, headers=headers, tablefmt=fmt, floatfmt=".4g", disable_numparse=True)


def to_json(obj) -> str:
    """JSON with Paths and other objects stringified; NaN written as null (``export.jsonable``)."""
    return json.dumps(jsonable(obj), indent=2, allow_nan=False)


def g(x, digits: int = 4) -> str:
    """A short number: 4 significant digits."""
    return "-" if x is None else f"{x:.{digits}g}"


def render_inspect(infos: list[dict]) -> str:
    """One block per adapter: config facts, then norms by module type."""
    blocks = []
    for d in infos:
        facts = [
            ("path", d["path"]), ("peft type", d["peft_type"]), ("base model", d["base_model"] or "-"),
            ("modules", f"{d['modules']} ({d['layers']} layers x {len(d['module_types'])} types)"),
            ("target modules", ", ".join(d["module_types"])),
            ("ranks", ", ".join(f"r={k}: {v}" for k, v in d["ranks"].items())),
            ("scale rule", f"{d['scale_rule']}, lora_alpha={g(d['lora_alpha'])}, scales "
                           + ", ".join(f"{float(k):.6g} x{v}" for k, v in d["scales"].items())),
            ("dtype", d["dtype"]), ("weights", d["weights"]),
            ("norm ||scale*B@A||", g(d["norm"], 6)), ("sha256", d["sha256"]),
        ]
        if d["rank_pattern"] or d["alpha_pattern"]:
            facts.append(("patterns", f"rank_pattern {len(d['rank_pattern'])} keys, "
                                      f"alpha_pattern {len(d['alpha_pattern'])} keys"))
        if d["embedding_modules"]:
            facts.append(("embedding LoRA", ", ".join(d["embedding_modules"])))
        if d["base_layer_copies"]:
            facts.append(("note", f"{len(d['base_layer_copies'])} saved base-layer copies ignored (not the update)"))
        norms = table([(t, g(n, 6)) for t, n in d["norm_by_type"].items()], ["module type", "norm"])
        blocks.append(table(facts, ["", ""], "plain") + "\n\n" + norms)
    return "\n\n".join(blocks)


def render_merge(rep) -> str:
    """The report of ``project`` / ``refactor`` / ``run``: step, consensus, outputs, warnings.

    Args:
        rep (RunReport): what ``pipeline.run`` returned.
    """
    out = []
    ev = rep.evaluation
    r = rep.recipe
    if ev.step is not None:
        st = rep.step_dict()
        out.append(f"project: {r.base} + alpha * ({r.dir})   mode={st['mode']}")
        facts = [("alpha", repr(st["alpha"]) if st["alpha"] is not None else "per module (trust_scope=module)"),
                 ("trust", f"{st['trust']!r} ({st['scope']})" if st["trust"] is not None else "-"),
                 ("requested alpha", "-" if st["requested_alpha"] is None else repr(st["requested_alpha"])),
                 ("clipped by trust", "yes" if st["clipped"] else "no"),
                 ("||base||", g(st["base_norm"], 8)), ("||dir||", g(st["dir_norm"], 8)),
                 ("realized relative step", f"{st['realized']['global']!r}"),
                 ("per module min/median/max", " / ".join(g(st["realized"][k]) for k in
                                                          ("module_min", "module_median", "module_max")))]
        if st["dropped"]:
            facts.append(("dropped (disagree)", f"{len(st['dropped'])}: " + ", ".join(st["dropped"][:6])))
        out.append(table(facts, ["", ""], "plain"))
        if ev.consensus is not None:
            c = ev.consensus
            s = c.summary
            out.append(f"consensus vs {c.ref}: {s['agree']}/{s['modules']} modules agree, "
                       f"{s['agree_energy']:.2%} of the direction's energy, median cosine {s['cosine_median']:.4f}, "
                       f"min {s['cosine_min']:.4f} (on_disagree={c.on_disagree})")
    elif ev.method.name == "expression":
        out.append(f"refactor: {r.base}   rank={r.rank}")
    else:
        out.append(f"{rep.command}: {ev.method.name} of {r.base}   rank={r.rank}")
    if ev.missing:
        out.append("missing modules treated as zero: " + "; ".join(f"{k}: {len(v)}" for k, v in ev.missing.items()))
    rows = []
    for o in rep.outputs:
        f = o.figures
        rows.append([g(o.multiple), repr(o.alpha) if o.alpha is not None else "-",
                     g(o.realized["global"]) if o.realized is not None else "-",
                     f"{f['survival']:.6f}" if "survival" in f else "-",
                     g(f.get("residual", f["rel_error"])), g(f["dtype_effect"]),
                     f"{f['rank']['min']}..{f['rank']['max']}",
                     o.path or "(dry run)", (o.sha256 or "-")[:16]])
    out.append(table(rows, ["dose", "alpha", "step", "survival", "residual", "dtype effect", "ranks", "out",
                            "sha256"]))
    for o in rep.outputs:
        for w in o.warnings:
            out.append(f"warning: {o.path or 'dry run'}: {w}")
    for line in rep.recovered:
        out.append(f"note: {line}")
    if rep.dry_run:
        out.append("dry run: nothing written")
    return "\n\n".join(out)


def render_modules(rep, limit: int | None = None) -> str:
    """Per-module figures of the first output: rank, exact rank, relative error, survival.

    Args:
        rep (RunReport): what ``pipeline.run`` returned. limit (int | None): at most this many rows.
    """
    f = rep.outputs[0].figures["modules"]
    rows = [[m, e["rank"], e["exact_rank"], g(e["rel_error"]), g(e.get("survival"))]
            for m, e in list(f.items())[:limit]]
    return table(rows, ["module", "rank", "exact rank", "rel error", "survival"])
