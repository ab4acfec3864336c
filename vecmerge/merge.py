"""``run(recipe)``: the one path from a Recipe to written adapters and a report.

For every output (one, or one per dose multiple k) and module m::

    intended_m = base_m + k * alpha_m * dir'_m          (exact, factored, float64)
    written_m  = refactor(intended_m, rank policy), rounded to the output dtype

and the report says how much of the step survived:
``survival = sum_m <written_m - base_m, step_m> / ||step||^2`` and
``residual = ||written - intended|| / ||step||`` (global Frobenius norms, factored).
"""

from __future__ import annotations

import datetime
import math
import statistics
from pathlib import Path

import torch

from . import __version__
from .audit import agreement_rows, summarize
from .errors import CheckFailed, OutputError, RecipeError
from .errors import few as _few
from .export import MANIFEST_NAME, check_out, model_card, prepare_modules, write_adapter
from .expr import parse
from .kernels import map_modules
from .lowrank import SVD, LowRank, f64
from .recipe import Recipe
from .refactor import RankPolicy
from .subspace import InSpan, Subspace
from .surgery import choose_step, shape_direction
from .taskvector import TaskVector, align
from .workspace import Workspace

SURVIVAL_WARN = 0.99  # warn (and fail with --strict) when less of the step survives
RESIDUAL_WARN = 0.10  # ... or when the written update misses the intended one by more than this x ||step||
BASES_BUDGET = 1 << 30  # bytes of float64 bases kept across modules (see evaluate)
DTYPE_WARN = 0.01  # ... or when dtype rounding alone moves the update by more than this share of its norm


def _open_inputs(recipe: Recipe, ws: Workspace, forms: dict) -> dict:
    """Open every adapter the recipe names; check sha256 pins; return {name: {path, sha256}}."""
    for name, entry in recipe.inputs.items():
        ws.adapters[name] = Path(entry["path"]).resolve()
    ws.modules_to_save = recipe.modules_to_save
    inputs = {}
    problems = []
    for form in forms.values():
        for name in form.names():
            if name in inputs:
                continue
            a = ws.adapter(name)
            pins = recipe.inputs.get(name, {})
            for key, path, actual in (("sha256", a.weights_path, a.sha256),
                                      ("config_sha256", a.path / "adapter_config.json", a.config_sha256)):
                if pins.get(key) and pins[key] != actual:
                    problems.append(f"inputs.{name}: {path} has sha256 {actual[:12]}..., the recipe pins "
                                    f"{pins[key][:12]}...; the adapter changed since the recipe was written")
            inputs[name] = {"path": str(a.path), "sha256": a.sha256, "config_sha256": a.config_sha256}
    if problems:
        raise RecipeError(problems, "inputs")
    return inputs


def _outputs(recipe: Recipe) -> list[tuple[float, str | None]]:
    """(multiple, folder) of every output; a dose ladder writes ``OUT-x<k>`` per multiple."""
    if not recipe.dose:
        return [(recipe.multiple, recipe.out)]
    plan = [(k * recipe.multiple, None if recipe.out is None else f"{recipe.out}-x{k:g}") for k in recipe.dose]
    paths = [p for _, p in plan if p is not None]
    if len(set(paths)) != len(paths):
        raise RecipeError([f"dose={recipe.dose}: two multiples write the same folder "
                           f"({sorted(p for p in paths if paths.count(p) > 1)[0]}); list each multiple once"])
    return plan


def _check_not_inputs(plan: list, inputs: dict) -> None:
    """Refuse an output folder that is, contains, or lies inside an input adapter."""
    for _, p in plan:
        out = Path(p).resolve()
        for name, i in inputs.items():
            src = Path(i["path"]).resolve()
            if out == src or src in out.parents or out in src.parents:
                raise OutputError(f"{p}: would overwrite input {name} ({src}); inputs are never written, "
                                  "choose another --out")


def evaluate(recipe: Recipe, ws: Workspace, progress=None) -> dict:
    """Everything but the writing: inputs, one basis per module, consensus, the step.

    ``state["tv"][k]`` (k in base, dir, ref) is a TaskVector of ``InSpan`` cores sharing one
    ``Subspace`` per module (see subspace.py); used by ``run`` and by ``verify``.
    """
    forms = {"base": parse(recipe.base)}
    if recipe.dir:
        forms["dir"] = parse(recipe.dir)
    if recipe.consensus:
        forms["ref"] = parse(recipe.consensus.ref)
    inputs = _open_inputs(recipe, ws, forms)
    vecs = {name: ws.vector(name) for form in forms.values() for name in form.names()}
    names = align(list(vecs.values()), list(vecs), recipe.allow_missing)
    missing = {n: [m for m in names if m not in v.modules] for n, v in vecs.items()}
    specs = {m: next(v.specs[m] for v in vecs.values() if m in v.specs) for m in names}

    # Keep every module's bases when they fit in BASES_BUDGET (saves forming them twice); else
    # hold only the small cores and form one module's bases at a time when writing.
    widths = {m: sum(v.modules[m].rank for v in vecs.values() if m in v.modules) for m in names}
    keep = sum(8 * w * sum(specs[m].shape) for m, w in widths.items()) <= BASES_BUDGET

    def module_cores(m: str) -> dict:
        terms = {n: v.modules[m] for n, v in vecs.items() if m in v.modules}
        space, own = Subspace.of(list(terms.values()), specs[m].shape, keep_bases=keep)
        proj = dict(zip(terms, own))
        out = {}
        for k, form in forms.items():
            x = space.zero()
            for n in form.names():
                if n in proj and form.coeffs[n] != 0.0:
                    x = x + proj[n] * form.coeffs[n]
            out[k] = x
        return out

    per = map_modules(module_cores, names, progress)
    tv = {k: TaskVector({m: per[m][k] for m in names}, specs) for k in forms}
    state = {"recipe": recipe, "inputs": inputs, "names": names, "forms": forms, "tv": tv,
             "missing": {k: v for k, v in missing.items() if v}, "vecs": vecs}
    if not recipe.dir:
        return state
    dropped = []
    if recipe.consensus:
        rows = agreement_rows(tv["ref"], tv["dir"], names)
        summary = summarize(rows)
        c = recipe.consensus
        share = summary["agree"] / summary["modules"] if summary["modules"] else 0.0
        state["consensus"] = {"ref": c.ref, "on_disagree": c.on_disagree, "min_agree": c.min_agree,
                              **summary, "rows": rows}
        bad = summary["disagreeing"]
        if c.min_agree is not None and share < c.min_agree:
            raise CheckFailed(f"consensus: {summary['agree']}/{summary['modules']} modules agree "
                              f"({share:.1%}) < min_agree {c.min_agree:g}; disagreeing: {_few(bad)}")
        if bad and c.on_disagree == "fail":
            raise CheckFailed(f"consensus: {len(bad)}/{summary['modules']} module(s) disagree with "
                              f"{c.ref}: {_few(bad)}; nothing written (use --on-disagree drop|keep)")
        if c.on_disagree == "drop":
            dropped = bad
    shaped = shape_direction(tv["dir"], mode=recipe.mode, base=tv["base"], ref=tv.get("ref"), dropped=dropped)
    state["dropped"] = dropped
    state["shaped"] = shaped
    state["step"] = choose_step(tv["base"], shaped, trust=recipe.trust, alpha=recipe.alpha,
                                scope=recipe.trust_scope)
    return state


def intended_core(state: dict, m: str, multiple: float) -> tuple[InSpan, InSpan | None]:
    """``(base_m + multiple * alpha_m * dir'_m, the step)`` as cores (base alone for a refactor)."""
    base = state["tv"]["base"][m]
    if "step" not in state:
        return base, None
    step_m = state["shaped"][m] * (state["step"].module_alpha[m] * multiple)
    return base + step_m, step_m


def intended(state: dict, m: str, multiple: float) -> tuple[LowRank, LowRank | None]:
    """``intended_core`` as factors (rank p: the module's basis), for checks that want a LowRank."""
    target, step_m = intended_core(state, m, multiple)
    return target.lowrank(), None if step_m is None else step_m.lowrank()


def _cut(target: InSpan, policy: RankPolicy) -> tuple[LowRank, torch.Tensor, int, int, float]:
    """Re-factor a core by the policy: (factors, kept core, kept rank, exact rank, cut error)."""
    U, S, Vh = torch.linalg.svd(target.C, full_matrices=False)
    k, exact = policy.choose(SVD(U, S, Vh, target.floor))  # the small SVD: only S and floor are read
    root = torch.sqrt(S[:k])
    factors = LowRank(target.space.left(U[:, :k] * root), target.space.right(root[:, None] * Vh[:k]), 1.0)
    kept = (U[:, :k] * S[:k]) @ Vh[:k]
    return factors, kept, k, exact, float(torch.sqrt((S[k:] ** 2).sum()))


def build_output(state: dict, multiple: float, progress=None) -> dict:
    """Re-factor every module, round to the dtype, and measure what survived (no file I/O)."""
    recipe: Recipe = state["recipe"]
    names = state["names"]
    keep_base = recipe.rank == "keep-base"
    policy = None if keep_base else RankPolicy.parse(recipe.rank)
    keep = tuple(names) if keep_base else ()
    specs = state["tv"]["base"].specs
    tensors, written = {}, {}

    def one(m: str) -> dict:
        target, step_m = intended_core(state, m, multiple)
        if keep_base:
            own = state["vecs"][state["forms"]["base"].names()[0]]
            b0 = own.modules[m] if m in own.modules else LowRank.zeros(target.shape)
            s = step_m.svd()
            upd = s.truncate(s.exact_rank())
            sc = b0.scale if b0.scale != 0 else 1.0
            x = LowRank(_cat1(b0.B, upd.B / sc), _cat0(b0.A, upd.A), sc)
            row = {"rank": x.rank, "exact_rank": x.rank, "cut_error": s.dropped_error(upd.rank), "kept": target.C}
        else:
            x, kept, k, exact, cut = _cut(target, policy)
            row = {"rank": k, "exact_rank": exact, "cut_error": cut, "kept": kept}
        t, w = prepare_modules({m: x}, specs, recipe.dtype, keep)
        tensors.update(t)
        written.update(w)
        row["e_norm"], row["e_core"] = rounding(w[m].lowrank, x, target.space)
        target.space.release()  # one module's full-size bases at a time
        row["target"], row["step"] = target, step_m
        return row

    rows = map_modules(one, names, progress)
    written = {m: written[m] for m in names}
    return {"prepared": (tensors, written), "rows": rows, "multiple": multiple,
            "figures": _figures(state, written, rows)}


def _cat1(x, y):
    return torch.cat([f64(x), f64(y)], 1) if y.numel() else x


def _cat0(x, y):
    return torch.cat([f64(x), f64(y)], 0) if y.numel() else x


def rounding(written: LowRank, exact: LowRank, space: Subspace) -> tuple[float, torch.Tensor]:
    """``E = W - R`` of a rounded copy W of factors R: ``(||E||_F, Qb^T E Qa)``.

    ``E = (B1 - B2) A1 + B2 (A1 - A2)`` with ``B1 = s_W B_W``, ``B2 = s_R B_R``: every term is of the
    order of the rounding, so its Gram norm ``sum((X^T X) * (Y Y^T))`` loses no digits.
    """
    if exact.rank == 0:
        return 0.0, space.zero().C
    B1, A1 = written.scale * f64(written.B), f64(written.A)
    B2, A2 = exact.scale * f64(exact.B), f64(exact.A)
    X = torch.cat([B1 - B2, B2], 1)
    Y = torch.cat([A1, A1 - A2], 0)
    sq = float(((X.T @ X) * (Y @ Y.T)).sum())
    return max(sq, 0.0) ** 0.5, space.core_of(X, Y)


def _figures(state, written: dict, rows: dict) -> dict:
    """Survival, residual, dtype effect, per-module rank and error: cores plus one Gram per module.

    With T the intended update, R the re-factored one (in the span) and W = R + E the stored one:
    ``||W - T||^2 = ||R - T||^2 + ||E||^2 + 2 <R - T, E>`` and
    ``<W - base, step> = <R - base, step> + <E, step>``.
    """
    base = state["tv"]["base"]
    has_step = "step" in state
    step_sq = inner_sum = resid_sq = dtype_sq = target_sq = 0.0
    per = {}
    for m, w in written.items():
        r = rows[m]
        target: InSpan = r["target"]
        e_norm, e_core = r["e_norm"], r["e_core"]
        diff = r["kept"] - target.C
        err = max(float((diff**2).sum()) + e_norm**2 + 2 * float((diff * e_core).sum()), 0.0) ** 0.5
        tn = target.norm()
        resid_sq += err * err
        dtype_sq += e_norm * e_norm
        target_sq += tn * tn
        entry = {"rank": w.rank, "exact_rank": r["exact_rank"], "rel_error": err / tn if tn > 0 else err,
                 "cut_error": r["cut_error"]}
        if has_step:
            s = r["step"].C
            sn = float(torch.linalg.matrix_norm(s))
            moved = float(((r["kept"] - base[m].C) * s).sum()) + float((e_core * s).sum())
            step_sq += sn * sn
            inner_sum += moved
            entry["step_norm"] = sn
            entry["survival"] = moved / (sn * sn) if sn > 0 else 1.0
        per[m] = entry
    ranks = [e["rank"] for e in per.values()]
    fig = {"modules": per,
           "rank": {"min": min(ranks), "median": statistics.median(ranks), "max": max(ranks)},
           "rel_error": math.sqrt(resid_sq / target_sq) if target_sq > 0 else math.sqrt(resid_sq),
           "dtype_effect": math.sqrt(dtype_sq / target_sq) if target_sq > 0 else 0.0}
    if has_step:
        fig["survival"] = inner_sum / step_sq if step_sq > 0 else 1.0
        fig["residual"] = math.sqrt(resid_sq / step_sq) if step_sq > 0 else 0.0
        fig["dtype_effect_on_step"] = math.sqrt(dtype_sq / step_sq) if step_sq > 0 else 0.0
    return fig


def manifest_for(state: dict, out: dict, path: str | None) -> dict:
    """The ``vecmerge.json`` content for one output: the resolved recipe, inputs, figures."""
    recipe: Recipe = state["recipe"]
    d = recipe.to_dict()
    d.pop("dose", None)
    d["multiple"] = out["multiple"]
    d["out"] = path
    d["inputs"] = {n: {"path": i["path"], "sha256": i["sha256"], "config_sha256": i["config_sha256"]}
                   for n, i in state["inputs"].items()}
    resolved = {"modules": len(state["names"])}
    if "step" in state:
        st = state["step"]
        resolved.update(alpha=None if st.alpha is None else st.alpha * out["multiple"],
                        alpha_chosen=st.alpha, clipped=st.clipped, dropped=state["dropped"],
                        realized=st.realized(out["multiple"]))
        if st.alpha is None:
            resolved["module_alpha"] = {m: a * out["multiple"] for m, a in st.module_alpha.items()}
    fig = out["figures"]
    return {"tool": "vecmerge", "created": datetime.datetime.now(datetime.timezone.utc).isoformat(),
            "kind": recipe.kind, "recipe": d, "resolved": resolved, "inputs": state["inputs"],
            "missing_modules": state["missing"],
            "figures": {k: v for k, v in fig.items() if k != "modules"},
            "modules": {m: {k: e[k] for k in ("rank", "exact_rank", "rel_error", "survival") if k in e}
                        for m, e in fig["modules"].items()}}


def run(recipe: Recipe, ws: Workspace | None = None, *, dry_run: bool = False, force: bool = False,
        progress=None) -> dict:
    """Evaluate, gate, step, re-factor and (unless ``dry_run``) write every output.

    Args:
        recipe (Recipe): what to do. ws (Workspace | None): name resolution (default: cwd).
        dry_run (bool): compute the full report, write nothing. force (bool): replace outputs.
        progress: optional callable wrapping iterables (tqdm) for long loops.

    Returns:
        The report dict (see ``report.py``); raises CheckFailed (exit 1) for a failed gate.
    """
    ws = ws or Workspace()
    plan = _outputs(recipe)
    if not dry_run:
        if any(p is None for _, p in plan):
            raise RecipeError(["out: missing (where to write the adapter), or use --dry-run"])
        for _, p in plan:
            check_out(p, force)
    state = evaluate(recipe, ws, progress)
    if not dry_run:
        _check_not_inputs(plan, state["inputs"])
    template = state["vecs"][state["forms"]["base"].names()[0]]
    base_adapter = ws.adapter(state["forms"]["base"].names()[0])
    same = set(state["names"]) == set(template.modules)
    report = {"command": recipe.kind, "vecmerge_version": __version__, "recipe": recipe.to_dict(),
              "inputs": state["inputs"], "modules": len(state["names"]), "missing_modules": state["missing"],
              "dry_run": dry_run, "outputs": []}
    if "consensus" in state:
        report["consensus"] = state["consensus"]
    if "step" in state:
        st = state["step"]
        report["step"] = {"alpha": st.alpha, "trust": st.trust, "scope": st.scope,
                          "requested_alpha": st.requested_alpha, "clipped": st.clipped,
                          "base_norm": st.base_norm, "dir_norm": st.dir_norm, "mode": recipe.mode,
                          "dropped": state["dropped"], "realized": st.realized()}
    built = []
    for multiple, path in plan:
        out = build_output(state, multiple, progress)
        fig = out["figures"]
        warnings = []
        if "survival" in fig and fig["survival"] < SURVIVAL_WARN:
            warnings.append(f"only {fig['survival']:.2%} of the step survives (rank {recipe.rank}, "
                            f"dtype {recipe.dtype}); use --rank exact or a wider dtype")
        if "step" in state and state["step"].scope == "module":
            st = state["step"]
            idle = [m for m in state["names"] if st.base_module_norms[m] == 0 and st.dir_module_norms[m] > 0]
            if idle:
                warnings.append(f"{len(idle)} module(s) have a zero backbone, so trust_scope=module gives them "
                                f"no step: {_few(idle)}; use trust_scope=global or --alpha")
        fix = " or ".join(([] if recipe.rank in ("exact", "keep-base") else ["--rank exact"])
                          + ([] if recipe.dtype == "fp32" else ["--dtype fp32"])) or "a larger step"
        if fig.get("residual", 0.0) > RESIDUAL_WARN:
            warnings.append(f"the written update is off the intended one by {fig['residual']:.1%} of the step "
                            f"(rank {recipe.rank}, dtype {recipe.dtype}); use {fix}")
        if fig["dtype_effect"] > DTYPE_WARN:
            warnings.append(f"rounding to {recipe.dtype} moved the update by {fig['dtype_effect']:.1%} of its norm "
                            "(entries under- or overflow); use --dtype fp32")
        entry = {"multiple": multiple, "path": path, "figures": fig, "warnings": warnings,
                 "alpha": None if "step" not in state or state["step"].alpha is None
                 else state["step"].alpha * multiple}
        if "step" in state:
            entry["realized"] = state["step"].realized(multiple)
        built.append((out, entry))
    failing = [e for _, e in built if e["warnings"]]
    if recipe.strict and failing:
        raise CheckFailed(f"--strict: {failing[0]['warnings'][0]}; nothing written")
    for out, entry in built:
        if not dry_run:
            manifest = manifest_for(state, out, entry["path"])
            card = model_card(base_adapter.config.base_model, Path(entry["path"]).name, _card_body(manifest))
            res = write_adapter(entry["path"], out["prepared"], state["tv"]["base"].specs,
                                template=base_adapter.config, manifest=manifest, card=card,
                                dtype=recipe.dtype, force=force, same_modules=same)
            entry["sha256"] = res["sha256"]
            entry["manifest"] = str(Path(entry["path"]) / MANIFEST_NAME)
        report["outputs"].append(entry)
    return report


def _card_body(manifest: dict) -> str:
    r = manifest["recipe"]
    lines = ["Made with [vecmerge](https://pypi.org/project/vecmerge/): LoRA task-vector surgery.", ""]
    if r.get("dir"):
        lines.append(f"    {r['base']} + alpha * ({r['dir']})")
        res = manifest["resolved"]
        if res.get("alpha") is not None:
            lines += ["", f"- alpha = {res['alpha']!r}"]
        lines.append(f"- realized relative step = {res['realized']['global']!r}")
        lines.append(f"- mode = {r.get('mode', 'add')}, trust = {r.get('trust')}, "
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
