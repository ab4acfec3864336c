"""``vecmerge.json`` and the model card of one output: the resolved recipe, its inputs, its figures.

The manifest is what makes an output re-derivable: ``vecmerge verify`` re-evaluates its ``recipe``
from its pinned ``inputs`` and compares the result with the stored weights and these figures.
"""

from __future__ import annotations

import datetime

from .build import BuiltOutput
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
    resolved = resolved_for(ev, built.multiple)
    fig = built.figures
    return {"tool": "vecmerge", "created": datetime.datetime.now(datetime.timezone.utc).isoformat(),
            "kind": recipe.kind, "method": ev.method.name, "recipe": d, "resolved": resolved, "inputs": inputs,
            "missing_modules": ev.missing,
            "figures": {k: v for k, v in fig.items() if k != "modules"},
            "modules": {m: {k: e[k] for k in ("rank", "exact_rank", "rel_error", "survival") if k in e}
                        for m, e in fig["modules"].items()}}


def resolved_for(ev: Evaluation, multiple: float) -> dict:
    """The manifest's ``resolved``: module count and, with a step, alpha x dose, clipping, dropped, realized.

    Args:
        ev (Evaluation): the evaluated recipe. multiple (float): the output's dose.
    """
    resolved = {"modules": len(ev.names)}
    if ev.step is not None:
        st, k = ev.step, multiple
        resolved.update(alpha=None if st.alpha is None else st.alpha * k, alpha_chosen=st.alpha,
                        clipped=st.clipped, dropped=list(ev.dropped), zeroed=list(ev.zeroed),
                        realized=st.realized(k))
        if st.alpha is None:
            resolved["module_alpha"] = {m: a * k for m, a in st.module_alpha.items()}
    return resolved


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
    else:
        lines.append(f"    {r['base']}")
    fig = manifest["figures"]
    lines.append(f"- rank policy = {r.get('rank', 'exact')}, ranks {fig['rank']['min']}..{fig['rank']['max']}, "
                 f"relative error {fig['rel_error']:.3e}")
    lines += ["", "Inputs (sha256 of adapter_model):", ""]
    lines += [f"- {n}: `{i['sha256']}`" for n, i in manifest["inputs"].items()]
    lines += ["", "`vecmerge.json` holds the full recipe; `vecmerge verify <this folder>` re-derives it."]
    return "\n".join(lines)
