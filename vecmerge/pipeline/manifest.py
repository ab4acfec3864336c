"""``vecmerge.json`` and the model card of one output: the resolved recipe, its inputs, its figures.

The manifest is what makes an output re-derivable: ``vecmerge verify`` re-evaluates its ``recipe``
from its pinned ``inputs`` and compares the result with the stored weights and these figures.
"""

from __future__ import annotations

import datetime

from .build import CUT_SEED, BuiltOutput
from .evaluation import Evaluation


def manifest_for(ev: Evaluation, built: BuiltOutput, path: str | None) -> dict:
    """The ``vecmerge.json`` content for one output (``export.write_adapter`` adds ``output``).

    Args:
        ev (Evaluation): the evaluated recipe. built (BuiltOutput): this output. path (str | None): its folder.
    """
    recipe = ev.recipe
    d = recipe.to_dict()
    d.pop("dose", None)
    d["multiple"] = built.multiple
    d["out"] = path
    inputs = {n: i.to_dict() for n, i in ev.inputs.items()}
    d["inputs"] = inputs
    resolved = {"modules": len(ev.names)}
    if ev.step is not None:
        st, k = ev.step, built.multiple
        resolved.update(alpha=None if st.alpha is None else st.alpha * k, alpha_chosen=st.alpha,
                        clipped=st.clipped, dropped=list(ev.dropped), zeroed=list(ev.zeroed),
                        realized=st.realized(k))
        if st.alpha is None:
            resolved["module_alpha"] = {m: a * k for m, a in st.module_alpha.items()}
    sel = ev.selection()
    if sel is not None:
        resolved["selection"] = sel
    if ev.multipliers:
        resolved["multipliers"] = dict(ev.multipliers)
    extra = {k: v for k, v in (ev.params or {}).items() if k not in recipe.params}
    if extra:
        resolved["method_params"] = extra
    if recipe.kind == "merge":
        resolved["space"] = ev.method.space_for(recipe.params)
        if any(e.get("cut") == "randomized" for e in built.figures["modules"].values()):
            resolved["randomized_svd"] = {"seed": CUT_SEED, "seeds": "module_seed(seed, module)",
                                          "power_iters": "2, or 3 above rank min(out, in)/8", "oversample":
                                          "max(10, rank // 2)"}
    fig = built.figures
    keys = ("rank", "exact_rank", "rel_error", "survival", "cut", "power_iters")
    return {"tool": "vecmerge", "created": datetime.datetime.now(datetime.timezone.utc).isoformat(),
            "kind": recipe.kind, "method": ev.method.name, "recipe": d, "resolved": resolved, "inputs": inputs,
            "missing_modules": ev.missing,
            "figures": {k: v for k, v in fig.items() if k != "modules"},
            "modules": {m: {k: e[k] for k in keys if k in e} for m, e in fig["modules"].items()}}


def card_body(manifest: dict) -> str:
    """The model card's text: the formula with alpha to full precision, the rank policy, the input hashes."""
    r = manifest["recipe"]
    lines = ["Made with [vecmerge](https://pypi.org/project/vecmerge/): LoRA task-vector surgery.", ""]
    if r.get("dir"):
        lines.append(f"    {r['base']} + alpha * ({r['dir']})")
        res = manifest["resolved"]
        if res.get("alpha") is not None:
            lines += ["", f"- alpha = {res['alpha']!r}"]
        lines.append(f"- realized relative step = {res['realized']['global']!r}")
        lines.append(f"- mode = {r.get('method', 'add')}, trust = {r.get('trust')}, "
                     f"scope = {r.get('trust_scope', 'global')}")
    elif r.get("models"):
        lines.append(f"    {merge_formula(r)}")
        lines.append("")
        lines += [f"- {k} = {r[k]!r}" for k in ("density", "space", "majority", "seed", "t", "slerp_scope") if k in r]
    else:
        lines.append(f"    {r['base']}")
    sel = manifest["resolved"].get("selection")
    if sel:
        what = ", ".join(f"{k} {sel[k]!r}" for k in ("only", "exclude") if sel[k] is not None)
        rest = "keep the backbone" if sel["left_out_means"].startswith("no step") else "are not in this adapter"
        lines.append(f"- modules: {sel['selected']} of {sel['of']} selected ({what}); the others {rest}")
    if manifest["resolved"].get("multipliers"):
        lines.append(f"- per-module multipliers: {r.get('multipliers')}")
    fig = manifest["figures"]
    if r.get("models"):
        lines.append(f"- survival of the intended merge = {fig['survival']!r}")
    lines.append(f"- rank policy = {r.get('rank', 'exact')}, ranks {fig['rank']['min']}..{fig['rank']['max']}, "
                 f"relative error {fig['rel_error']:.3e}")
    lines += ["", "Inputs (sha256 of adapter_model):", ""]
    lines += [f"- {n}: `{i['sha256']}`" for n, i in manifest["inputs"].items()]
    lines += ["", "`vecmerge.json` holds the full recipe; `vecmerge verify <this folder>` re-derives it."]
    return "\n".join(lines)


def merge_formula(recipe: dict) -> str:
    """``ties(0.5 * v28 [density 0.3], 0.5 * (v51 - v28))``: a merge recipe in one line."""
    parts = []
    for e in recipe.get("models") or []:
        w, model = e.get("weight", 1.0), e["model"]
        model = model if model.replace("_", "").replace(".", "").isalnum() else f"({model})"
        term = model if w == 1.0 else f"{w!r} * {model}"
        parts.append(term + (f" [density {e['density']!r}]" if e.get("density") is not None else ""))
    return f"{recipe.get('method')}({', '.join(parts)})"
