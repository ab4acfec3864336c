"""What a pipeline output's ``vecmerge.json`` and model card say: the resolved recipe, its inputs, its figures.

The manifest makes an output re-derivable: ``vecmerge verify`` re-evaluates its ``recipe`` from its pinned
``inputs`` and compares the result with the stored weights and these figures. Local paths stay portable:
``workspace`` is relative to the output folder and every other local path relative to the workspace (no
absolute path in an upload-ready folder; ``recipe.manifest_root`` reads them back). The parts every manifest
shares, its file name, schema and tolerances are ``outputs.manifest``'s; this module builds the
merge-specific middle. Which paths, and hub ids: docs/design/pipeline.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..outputs.manifest import portable, stamp
from ..workspace.base_model import canonical
from .build import CUT_SEED, BuiltOutput
from .evaluation import Evaluation


def _portable_base(name: str | None, home: Path, hub: tuple | None = None) -> str | None:
    """A declared base model as recorded: the hub id when it is the local folder the output's ``base_model_id``
    names, else an absolute folder inside the workspace relative to it, else as declared.

    Args:
        name (str | None): an input's declared base model. home (Path): the workspace (resolved).
        hub (tuple | None): ``(canonical folder, hub id)``: the template's declared base and the output's
            ``base_model_id`` (None without one).
    """
    if hub is not None and isinstance(name, str) and Path(canonical(name, (home,)) or "").is_absolute() \
            and canonical(name, (home,)) == hub[0]:
        return hub[1]
    if isinstance(name, str) and Path(name).is_absolute():
        return portable(name, home)
    return name


def manifest_for(ev: Evaluation, built: BuiltOutput, path: str | None, home: Path | None = None,
                 gate: dict | None = None, source: dict | None = None) -> dict:
    """The ``vecmerge.json`` content for one output (``peft.write.write_adapter`` closes it with ``output``).

    Args:
        ev (Evaluation): the evaluated recipe. built (BuiltOutput): this output. path (str | None): its folder.
        home (Path | None): the workspace folder (``Workspace.home``); input paths are written relative to it.
        gate (dict | None): the gate it passed (``GateCheck.to_dict``), kept as ``gate``.
        source (dict | None): the configuration file the recipe came from (``merge --config``), kept as ``config``.
    """
    recipe = ev.recipe
    d = recipe.to_dict()
    d.pop("dose", None)
    d["multiple"] = built.multiple
    d["out"] = path
    inputs = {n: i.to_dict() for n, i in ev.inputs.items()}
    where = {}
    if home is not None and path is not None:
        home = Path(home).resolve()
        d["out"] = portable(path, home)
        where = {"workspace": portable(home, Path(path).resolve())}
        hub = None
        if recipe.base_model_id:
            hub = (canonical(ev.template.config.base_model, (home,)), recipe.base_model_id)
        inputs = {n: {**i, "path": portable(i["path"], home),
                      "base_model": _portable_base(i["base_model"], home, hub)} for n, i in inputs.items()}
    d["inputs"] = inputs
    if d.get("base_model") is not None and home is not None:
        d["base_model"] = portable(d["base_model"], Path(home).resolve())
    for key in ("protect", "target"):  # prompt files, portable like the inputs
        if d.get(key) and home is not None:
            d[key] = {n: portable(f, Path(home).resolve()) for n, f in d[key].items()}
    if gate is not None and home is not None and gate.get("ledger"):
        gate = {**gate, "ledger": portable(gate["ledger"], Path(home).resolve())}
    if source is not None and home is not None and isinstance(source.get("path"), str):
        source = {**source, "path": portable(source["path"], Path(home).resolve())}
    protection = ev.protection if ev.protection is None or home is None else portable_protection(ev.protection, home)
    resolved = resolved_for(ev, built.multiple, built.figures["modules"])
    figures, modules = manifest_figures(built.figures)
    return {**stamp(recipe.kind), "method": ev.method.name, **where, "recipe": d, "resolved": resolved,
            "inputs": inputs, "missing_modules": ev.missing, "figures": figures, "modules": modules,
            **({} if gate is None else {"gate": gate}), **({} if source is None else {"config": source}),
            **({} if protection is None else {"protection": protection})}


def portable_protection(protection: dict, home: Path) -> dict:
    """A protected step's figures with the base model folder and each prompt file relative to ``home``.

    Args:
        protection (dict): ``Evaluation.protection`` (``base_model.path``, ``protect``/``target`` sets' ``path``).
        home (Path): the workspace folder.
    """
    home = Path(home).resolve()
    out = dict(protection)
    base = out.get("base_model")
    if isinstance(base, dict) and isinstance(base.get("path"), str):
        out["base_model"] = {**base, "path": portable(base["path"], home)}
    for role in ("protect", "target"):
        sets = out.get(role)
        if isinstance(sets, dict):
            out[role] = {k: {**e, "path": portable(e["path"], home)} if isinstance(e, dict)
                         and isinstance(e.get("path"), str) else e for k, e in sets.items()}
    return out


MODULE_KEYS = ("rank", "exact_rank", "rel_error", "survival", "cut", "power_iters")


def manifest_figures(fig: dict) -> tuple[dict, dict]:
    """``(figures, modules)`` as the manifest records them: every figure but the per-module table, and of
    each module ``MODULE_KEYS`` (``verify`` rebuilds and compares both)."""
    return ({k: v for k, v in fig.items() if k != "modules"},
            {m: {k: e[k] for k in MODULE_KEYS if k in e} for m, e in fig["modules"].items()})


def resolved_for(ev: Evaluation, multiple: float, module_figures: dict | None = None) -> dict:
    """The manifest's ``resolved``: what the recipe resolved to (alpha x dose, clipping, the modules the
    consensus dropped and the method zeroed, the realized step; the selection, multipliers and the
    method's prepared parameters; a merge's space and randomized cut).

    Args:
        ev (Evaluation): the evaluated recipe. multiple (float): the output's dose.
        module_figures (dict | None): per module figures (their ``cut``), to say whether a randomized SVD ran.
    """
    recipe = ev.recipe
    resolved: dict[str, Any] = {"modules": len(ev.names)}
    if ev.step is not None:
        st, k = ev.step, multiple
        resolved.update(alpha=None if st.alpha is None else st.alpha * k, alpha_chosen=st.alpha,
                        clipped=st.clipped, dropped_by_consensus=list(ev.dropped),
                        zeroed_by_method=list(ev.zeroed), zeroed_reason=ev.method.zero_reason if ev.zeroed else None,
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
        if any(isinstance(e, dict) and e.get("cut") == "randomized" for e in (module_figures or {}).values()):
            resolved["randomized_svd"] = {"seed": CUT_SEED, "seeds": "module_seed(seed, module)",
                                          "power_iters": "2, or 3 above rank min(out, in)/8", "oversample":
                                          "max(10, rank // 2)"}
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
    if manifest.get("gate"):
        lines += ["", *gate_markdown(manifest["gate"])]
    lines += ["", "`vecmerge.json` holds the full recipe; `vecmerge verify <this folder>` re-derives it."]
    return "\n".join(lines)


def gate_markdown(gate: dict) -> list[str]:
    """The gate's table as markdown lines, for the model card (``GateCheck.to_dict``)."""
    def cell(text: object) -> str:
        return str(text).replace("|", "\\|").replace("\n", " ")

    g = gate
    lines = [f"Gate before writing ({g['backbone']} + alpha * ({g['x']} - {g['y']}), metric "
             f"`{g.get('metric') or '-'}`): {'PASSED' if g['passed'] else 'NOT PASSED'}", "",
             "| condition | result | detail | threshold | from |", "| --- | --- | --- | --- | --- |"]
    lines += [f"| {r['condition']} | {r['status']} | {cell(r['detail'])} | {cell(r['threshold'])} | "
              f"{cell(r['source'])} |" for r in g["rows"]]
    close = next((r["numbers"].get("closeness") for r in g["rows"] if r["condition"] == "common parent"), None)
    if close and close.get("cosine") is not None:
        lines += ["", f"Closeness of {g['x']} to {g['y']}: cosine {close['cosine']!r}, "
                      f"||{g['x']} - {g['y']}|| / ||{g['y']}|| = {close['relative_distance']!r}."]
    return lines


def merge_formula(recipe: dict) -> str:
    """``ties(0.5 * v28 [density 0.3], 0.5 * (v51 - v28))``: a merge recipe in one line."""
    parts = []
    for e in recipe.get("models") or []:
        w, model = e.get("weight", 1.0), e["model"]
        model = model if model.replace("_", "").replace(".", "").isalnum() else f"({model})"
        term = model if w == 1.0 else f"{w!r} * {model}"
        parts.append(term + (f" [density {e['density']!r}]" if e.get("density") is not None else ""))
    return f"{recipe.get('method')}({', '.join(parts)})"
