"""Rendering a merge's RunReport (project, merge, refactor, run): the step, the cut, the rounding, per module."""

from __future__ import annotations

from ..errors import few, shown
from .format import g, table


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
            facts.append(("dropped by consensus", f"{len(st['dropped'])}: {few(st['dropped'])} (they disagree "
                                                  "with the reference; on_disagree=drop)"))
        if st["zeroed"]:
            why = ev.method.zero_reason or "the mode gives them none"
            facts.append((f"no step from mode {st['mode']}", f"{len(st['zeroed'])}: {few(st['zeroed'])} ({why})"))
        out.append(table(facts, ["", ""], "plain"))
        if ev.consensus is not None:
            c = ev.consensus
            s = c.summary
            out.append(f"consensus vs {c.ref}: {s['agree']}/{s['modules']} modules agree in sign, "
                       f"{s['agree_energy']:.2%} of the direction's energy, median cosine {s['cosine_median']:.4f}, "
                       f"min {s['cosine_min']:.4f} (on_disagree={c.on_disagree})")
    elif ev.method.name == "expression":
        out.append(f"refactor: {r.base}   rank={r.rank}")
    else:
        out.append(f"{rep.command}: {merge_line(rep)}")
    sel = ev.selection()
    if sel is not None:
        what = " and ".join(f"{k} {sel[k]!r}" for k in ("only", "exclude") if sel[k] is not None)
        left = sel["left_out"]
        out.append(f"modules: {sel['selected']} of {sel['of']} selected ({what}); {len(left)} left out "
                   f"({sel['left_out_means']})" + (f": {', '.join(left[:4])}{' ...' if len(left) > 4 else ''}"
                                                   if left else ""))
    if ev.multipliers:
        counts: dict = {}
        for v in ev.multipliers.values():
            counts[v] = counts.get(v, 0) + 1
        pats = ", ".join(f"{k!r} x{v:g}" for k, v in (r.multipliers or {}).items())
        out.append(f"multipliers ({pats}): " + ", ".join(f"x{v:g} on {n} module(s)" for v, n in counts.items()))
    if ev.missing:
        out.append("missing modules treated as zero: " + "; ".join(f"{k}: {len(v)}" for k, v in ev.missing.items()))
    rows = []
    if rep.command == "merge":
        for o in rep.outputs:
            f = o.figures
            rows.append([f"{f['survival']:.6f}", g(f["rel_error"]), g(f["dtype_effect"]),
                         f"{f['rank']['min']}..{f['rank']['max']}", o.path or "(dry run)", (o.sha256 or "-")[:16]])
        out.append(table(rows, ["survival", "rel error", "dtype effect", "ranks", "out", "sha256"]))
        moved = rep.outputs[0].figures.get("moved") if rep.outputs else None
        if moved:
            out.append("distance of the intended merge from each model, ||merge - model|| / ||model||: "
                       + ", ".join(f"{e['model']} " + ("-" if e["distance"] is None else f"{e['distance']:.2%}")
                                   for e in moved)
                       + " (for scale: the user's v58 step that worked was 1.13% of its backbone)")
        rows = []
    for o in rep.outputs if rep.command != "merge" else ():
        f = o.figures
        rows.append([g(o.multiple), repr(o.alpha) if o.alpha is not None else "-",
                     g(o.realized["global"]) if o.realized is not None else "-",
                     f"{f['survival']:.6f}" if "survival" in f else "-",
                     g(f.get("residual", f["rel_error"])), g(f["dtype_effect"]),
                     f"{f['rank']['min']}..{f['rank']['max']}",
                     o.path or "(dry run)", (o.sha256 or "-")[:16]])
    if rep.command != "merge":
        out.append(table(rows, ["dose", "alpha", "step", "survival", "residual", "dtype effect", "ranks", "out",
                                "sha256"]))
    out += protection_lines(rep)
    for o in rep.outputs:
        if "experts" in o.figures:
            out.append(experts_line(o.figures))
    for o in rep.outputs:
        for w in o.warnings:
            out.append(f"warning: {o.path or 'dry run'}: {w}")
    for n in getattr(rep, "notes", ()):
        out.append(f"note: {n}")
    for line in rep.recovered:
        out.append(f"note: {line}")
    if rep.dry_run:
        out.append("dry run: nothing written")
    return "\n\n".join(out)


def protection_lines(rep) -> list[str]:
    """A protected step's figures, one block per energy: kept_drift per protected set, kept_direction, kept_change
    per target, the ranks of U, the prompt files' sha256 and the base model."""
    seen, out = set(), []
    for o in rep.outputs:
        p = o.protection
        if p is None or p["energy"] in seen:
            continue
        seen.add(p["energy"])
        rs, bm = p["rank_summary"], p["base_model"]
        lines = [f"protected step (E {p['energy']:g}): D' = s B (A - (A U) U^T) on {rs['modules']} module(s), rank of "
                 f"U {rs['min']}..{rs['max']} (mean {rs['mean']:.1f}); kept_direction ||D'||/||D|| = "
                 f"{g(p['kept_direction'])}; base model {shown(bm['path'])} "
                 f"(config sha256 {str(bm['config_sha256'])[:12]})"]
        rows = [[k, "protect", g(v["kept_drift"]), v["items"], v["positions"], v["sha256"][:16]]
                for k, v in p["protect"].items()]
        rows += [[k, "target", g(v["kept_change"]), v["items"], v["positions"], v["sha256"][:16]]
                 for k, v in p["target"].items()]
        lines.append(table(rows, ["set", "role", "kept (||D' X^T||/||D X^T||)", "items", "positions", "sha256"]))
        out.append("\n".join(lines))
    return out


def experts_line(fig: dict) -> str:
    """What one rank per MoE parameter costs in one output: padding, storage, and the per-expert cut's figures."""
    x = fig["experts"]
    ps = x["parameters"].values()
    ranks = sorted({p["rank"] for p in ps})
    padded = sum(p["padded_experts"] for p in ps)
    line = (f"experts: one rank per MoE parameter (PEFT's layout), {len(x['parameters'])} parameters "
            f"at rank {ranks[0]}..{ranks[-1]}; {padded} of {sum(p['experts'] for p in ps)} experts padded with "
            f"{x['zero_directions']} zero directions; {x['stored_directions']} directions stored where the "
            f"experts' own ranks need {x['own_directions']}")
    if "own_cut" in x:
        own = x["own_cut"]
        line += f"; with their own ranks: rel error {g(own['rel_error'])} (written: {g(fig['rel_error'])})"
        if "survival" in own:
            line += f", survival {own['survival']:.6f} (written: {fig['survival']:.6f})"
    return line


def render_modules(rep, limit: int | None = None) -> str:
    """Per-module figures of the first output: rank, exact rank, relative error, survival.

    Args:
        rep (RunReport): what ``pipeline.run`` returned. limit (int | None): at most this many rows.
    """
    f = rep.outputs[0].figures["modules"]
    rows = [[m, e["rank"], "-" if e["exact_rank"] is None else e["exact_rank"], g(e["rel_error"]),
             g(e.get("survival"))]
            for m, e in list(f.items())[:limit]]
    more = f"\n... and {len(f) - len(rows)} more modules" if len(rows) < len(f) else ""
    return table(rows, ["module", "rank", "exact rank", "rel error", "survival"]) + more


def merge_line(rep) -> str:
    """``ties of 2 models (weights 0.5, 0.5; density 0.5; space full)   rank=32``: a merge's header."""
    ev, r = rep.evaluation, rep.recipe
    p = dict(r.params)
    facts = [f"weights {', '.join(g(e['weight']) for e in r.models)}"] if any(
        e["weight"] != 1.0 for e in r.models) else []
    dens = [e.get("density", p.get("density")) for e in r.models]
    if any(d is not None for d in dens):
        facts.append(f"density {', '.join(g(d) for d in dens)}" if len(set(dens)) > 1 else f"density {g(dens[0])}")
    for k in ("space", "majority", "seed", "t", "slerp_scope"):
        if k in p:
            facts.append(f"{k} {p[k]}")
    extra = {k: v for k, v in (ev.params or {}).items() if k not in p}
    facts += [f"{k} = {v!r}" for k, v in extra.items()]
    models = ", ".join(e["model"] for e in r.models)
    return f"{ev.method.name} of {models}" + (f" ({'; '.join(facts)})" if facts else "") + f"   rank={r.rank}"
