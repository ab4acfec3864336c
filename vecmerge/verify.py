"""``vecmerge verify``: re-derive an output from its manifest and check it, before it is uploaded.

For an output folder OUT (written by ``pipeline.run``, manifest ``OUT/vecmerge.json``) and every module m,
with ``W_m = scale * B @ A`` read back from OUT and ``I_m = base_m + k * alpha_m * dir'_m`` recomputed
from the inputs in factored float64 (``pipeline.intended``, through the recipe's registered method):

- inputs: each input's weights and config hash to what the manifest pinned (a changed or missing
  input fails, by name, and nothing is recomputed from it);
- output: opens as plain PEFT LoRA; weights and config sha256 equal the manifest's; every factor finite;
- config: base model, target_modules covering every module, key set = the manifest's modules, the
  rank/alpha patterns resolving to the stored ranks, the scale PEFT applies (``lora_alpha / r``);
- recompute: the recipe re-evaluated gives the recorded alpha (``ALPHA_RTOL``);
- update: ``||W_m - I_m|| / ||I_m|| <= TOLERANCES[dtype]["update"]``; a rank-cut output (rank not
  ``exact``) instead reproduces its recorded per-module error within that tolerance;
- step: ``survival = sum_m <W_m - base_m, step_m> / ||step||^2`` within ``TOLERANCES[dtype]["survival"]``
  of 1 (of the recorded value for a rank-cut output);
- figures: the manifest's figures reproduce (``FIGURES_RTOL``).

Why these tolerances: storing balanced factors ``B = U sqrt(S)``, ``A = sqrt(S) Vh`` in a dtype of
unit roundoff u moves the update by about 0.6 u of its norm (fp32, u = 6e-8: 3.5e-8 measured). The
update tolerance is 1e-5 for fp32 (~170 u, room for unbalanced kept factors), 5e-3 for fp16
(u = 4.9e-4) and 3e-2 for bf16 (u = 3.9e-3). Rounding noise is nearly orthogonal to the step, so
survival stays within 1e-4 / 2e-2 / 5e-2 of 1 even where the noise is a sizeable share of a 1% step
(bf16, trust 0.0113 on the toy trajectory: 0.9953). With ``--base-model`` the rounding reaches the
logits as a share of the adapter's own effect on them: up to 1e-4 / 2e-2 / 1e-1 (bf16 measured 2e-2
on the tiny Qwen3, whose random adapters move the logits by 150%).
``verify_peft`` adds the real client (``--base-model``); ``verify_adapter`` holds the config checks
and the identities of adapters that have no manifest (``verify_identities``). The recomputation goes
through ``pipeline.evaluate`` and the very method object the output's recipe names.
"""

from __future__ import annotations

import math
from pathlib import Path

from .adapter import Adapter
from .checks import check, close, not_run, result, within
from .errors import OutputError, VecmergeError, few
from .export import read_manifest
from .lowrank import LowRank, combine
from .peft_format import CONFIG_NAME, LoraConfig
from .pipeline import evaluate, intended
from .recipe import Recipe
from .verify_adapter import config_checks, identity_checks, open_output
from .verify_peft import peft_checks
from .workspace import Workspace

TOLERANCES = {"fp32": {"update": 1e-5, "survival": 1e-4, "logits": 1e-4},
              "fp16": {"update": 5e-3, "survival": 2e-2, "logits": 2e-2},
              "bf16": {"update": 3e-2, "survival": 5e-2, "logits": 1e-1}}
ALPHA_RTOL = 1e-9       # alpha is a ratio of float64 norms: reproduces to round-off
FIGURES_RTOL = 1e-3     # recorded figures reproduce (same arithmetic; room for another device)


# -- inputs and the re-derivation -----------------------------------------------------------------
def input_check(manifest: dict) -> dict:
    """Every input the manifest pins exists and hashes as recorded: ``sha256(weights) == pin``, same for config.

    Args:
        manifest (dict): the output's vecmerge.json.
    """
    pinned = manifest["recipe"].get("inputs") or {}
    conf = manifest.get("inputs") or {}
    problems, figs = [], {}
    for name, entry in pinned.items():
        if not isinstance(entry, dict) or not isinstance(entry.get("path"), str):
            problems.append(f"input {name}: the manifest records no path")
            continue
        p = Path(entry["path"]).resolve()
        try:
            a = Adapter(p, modules_to_save=manifest["recipe"].get("modules_to_save", "refuse"))
        except VecmergeError as e:
            problems.append(f"input {name} is missing or unreadable: {e}")
            continue
        if a.sha256 != entry.get("sha256"):
            problems.append(f"input {name}: {a.weights_path} has sha256 {a.sha256[:16]}..., the manifest pins "
                            f"{str(entry.get('sha256'))[:16]}...: it changed after the merge")
        pin = (conf.get(name) if isinstance(conf.get(name), dict) else {}).get("config_sha256")
        if pin and a.config_sha256 != pin:
            problems.append(f"input {name}: {p / CONFIG_NAME} changed after the merge (sha256 "
                            f"{a.config_sha256[:16]}..., pinned {pin[:16]}...)")
        figs[name] = a.sha256
    if not pinned:
        problems.append("the manifest pins no inputs")
    return check("inputs", not problems, "; ".join(problems) or
                 f"{len(pinned)} inputs hash as pinned: {', '.join(pinned)}", figs)


def recompute(manifest: dict, root: Path, progress=None) -> tuple[dict, dict]:
    """Re-evaluate the manifest's recipe from its inputs; ``|alpha - recorded| <= ALPHA_RTOL |recorded|``.

    Args:
        manifest (dict): vecmerge.json. root (Path): folder for unlisted names (every input is listed).
        progress: optional iterable wrapper.

    Returns:
        (the ``Evaluation`` of the manifest's recipe, the ``recompute`` check); raises VecmergeError
        when it cannot evaluate.
    """
    recipe = Recipe.from_dict(manifest["recipe"], "manifest recipe")
    ev = evaluate(recipe, Workspace(root=root), progress)
    if ev.step is None:
        return ev, check("recompute", True, f"re-evaluated {recipe.base!r} ({ev.method.name}) from the inputs")
    st, res, k = ev.step, manifest.get("resolved") or {}, recipe.multiple
    problems, figs = [], {}
    if st.alpha is not None:
        figs = {"alpha": st.alpha * k, "recorded_alpha": res.get("alpha")}
        if not isinstance(res.get("alpha"), (int, float)) or not close(st.alpha * k, res["alpha"], ALPHA_RTOL, 0):
            problems.append(f"alpha recomputes to {st.alpha * k!r}, the manifest records {res.get('alpha')!r}")
    else:
        rec = res.get("module_alpha") or {}
        off = [m for m, a in st.module_alpha.items()
               if not isinstance(rec.get(m), (int, float)) or not close(a * k, rec[m], ALPHA_RTOL, 0)]
        figs = {"module_alpha_mismatches": len(off)}
        if off:
            problems.append(f"module alpha differs from the manifest's in {few(off)}")
    if sorted(ev.dropped) != sorted(res.get("dropped") or []):
        problems.append(f"consensus drops [{few(ev.dropped)}], the manifest recorded "
                        f"[{few(res.get('dropped') or [])}]")
    what = f"alpha = {figs['alpha']!r}" if "alpha" in figs else "every module's alpha"
    return ev, check("recompute", not problems, "; ".join(problems) or
                        f"{what} as recorded (rel {ALPHA_RTOL:g})", figs)


# -- the written update against the recomputed one ------------------------------------------------
def _scale_hint(W: LowRank, target: LowRank, tol: float) -> float | None:
    """``c`` when ``W = c * target`` within ``tol`` (a changed scale), else None."""
    tn = target.norm()
    if tn == 0.0:
        return None
    c = W.inner(target) / (tn * tn)
    return c if c != 0.0 and (W - target * c).norm() <= tol * abs(c) * tn else None


def compare(out: Adapter, ev, manifest: dict, tol: dict, progress=None) -> tuple[list[dict], dict]:
    """Per module ``||W_m - I_m|| / ||I_m||`` and the step's survival; returns (checks, {m: I_m}).

    Args:
        out (Adapter): the written output. ev (Evaluation): the manifest's recipe re-evaluated.
        manifest (dict): vecmerge.json. tol (dict): ``TOLERANCES[dtype]``.
    """
    recipe = ev.recipe
    cut = not recipe.rank_policy.lossless
    rec = manifest.get("modules") or {}
    base = ev.operands["base"]
    rows, expected, shape_bad = {}, {}, []
    err_sq = tgt_sq = step_sq = moved = 0.0
    for m in progress(ev.names) if progress else ev.names:
        target, step_m = intended(ev, m, recipe.multiple)
        expected[m] = target
        if m not in out.specs:
            shape_bad.append(f"{m}: recomputed but not written")
            continue
        if out.specs[m].shape != target.shape:
            shape_bad.append(f"{m}: {out.specs[m].shape} written, {target.shape} expected")
            continue
        try:
            W = out.factors(m)
        except VecmergeError:
            shape_bad.append(f"{m}: unreadable or non-finite factors")  # also reported by the finite check
            continue
        err, tn = (W - target).norm(), target.norm()
        err_sq, tgt_sq = err_sq + err * err, tgt_sq + tn * tn
        rows[m] = {"rel_error": err / tn if tn > 0 else err, "W": W, "target": target}
        if step_m is not None:
            sn = step_m.norm()
            mv = combine([(1.0, W), (-1.0, base[m].lowrank())]).inner(step_m)
            step_sq, moved = step_sq + sn * sn, moved + mv
            rows[m]["survival"] = mv / (sn * sn) if sn > 0 else 1.0
    tu = tol["update"]

    def off(m, r):
        if not cut:
            return not within(r["rel_error"], tu)
        want = rec.get(m, {}).get("rel_error")
        return not isinstance(want, (int, float)) or not within(abs(r["rel_error"] - want), tu)

    bad = [m for m, r in rows.items() if off(m, r)]
    worst = max(rows, key=lambda m: rows[m]["rel_error"], default=None)
    figs = {"max_rel_error": rows[worst]["rel_error"] if worst else None, "worst_module": worst,
            "rel_error": math.sqrt(err_sq / tgt_sq) if tgt_sq > 0 else math.sqrt(err_sq), "tolerance": tu,
            "compared_to": "recorded rank-cut error" if cut else "recomputed update"}
    if bad or shape_bad:
        hints = {m: _scale_hint(rows[m]["W"], rows[m]["target"], tu) for m in bad}
        m0 = bad[0] if bad else None
        detail = "; ".join(shape_bad[:3]) if shape_bad else (
            f"{len(bad)}/{len(rows)} modules differ from the recomputed update, e.g. {m0}: relative error "
            f"{rows[m0]['rel_error']:.3e} > {tu:g}" + (f" (recorded {rec.get(m0, {}).get('rel_error')!r})" if cut
                                                        else ""))
        scaled = f"scaled by {few(sorted({f'{h:.6g}' for h in hints.values() if h is not None}))}"
        config_changed = out.config_sha256 != (manifest.get("output") or {}).get("config_sha256")
        if bad and config_changed and all(h is not None for h in hints.values()):
            detail += (f"; the update is {scaled}: the scale PEFT applies (lora_alpha, r, alpha_pattern in "
                       f"{CONFIG_NAME}) changed")
        elif bad:
            detail += (f"; tensors of {few(bad)} in {out.weights_path.name} do not hold the recomputed factors"
                       + (f" ({scaled})" if all(h is not None for h in hints.values()) else ""))
        checks = [check("update", False, detail, {**figs, "bad_modules": bad})]
    else:
        checks = [check("update", True, f"every module within {tu:g} of the "
                        + ("recorded rank-cut error" if cut else "recomputed update (relative Frobenius)"), figs)]
    if ev.step is not None:
        surv = moved / step_sq if step_sq > 0 else 1.0
        want = (manifest.get("figures") or {}).get("survival", 1.0) if cut else 1.0
        ts = tol["survival"]
        resid = math.sqrt(err_sq / step_sq) if step_sq > 0 else 0.0
        checks.append(check("step", within(abs(surv - want), ts),
                            f"survival {surv:.8f} (||W - I|| / ||step|| = {resid:.3e}), expected {want:.8f} "
                            f"within {ts:g}", {"survival": surv, "residual": resid, "tolerance": ts,
                                               "step_norm": math.sqrt(step_sq)}))
    checks.append(_figures_check(manifest, rows, figs["rel_error"], checks))
    return checks, expected


def _figures_check(manifest: dict, rows: dict, rel_error: float, checks: list) -> dict:
    """The manifest's recorded figures reproduce: ``|x - recorded| <= 1e-12 + FIGURES_RTOL |recorded|``."""
    fig, rec = manifest.get("figures") or {}, manifest.get("modules") or {}
    got = {"rel_error": rel_error}
    step = next((c for c in checks if c["name"] == "step"), None)
    if step:
        got.update(survival=step["figures"]["survival"], residual=step["figures"]["residual"])
    off = [f"{k} {v:.6g} (recorded {fig.get(k)!r})" for k, v in got.items()
           if not isinstance(fig.get(k), (int, float)) or not close(v, fig[k], FIGURES_RTOL)]
    off += [f"{m} rel_error {r['rel_error']:.6g} (recorded {rec.get(m, {}).get('rel_error')!r})"
            for m, r in rows.items() if not isinstance(rec.get(m, {}).get("rel_error"), (int, float))
            or not close(r["rel_error"], rec[m]["rel_error"], FIGURES_RTOL)]
    return check("figures", not off, "; ".join(off[:4]) or f"recorded figures reproduce (rtol {FIGURES_RTOL:g})",
                 {k: v for k, v in got.items()})


def verify_output(path, base_model=None, progress=None) -> dict:
    """Re-derive the output at ``path`` from its manifest and run every check (see the module docstring).

    Args:
        path (str | Path): an output folder with ``vecmerge.json``.
        base_model (str | Path | None): a local ``transformers`` model folder: also load through PEFT.
        progress: optional callable wrapping iterables (tqdm).

    Returns:
        ``{target, passed, checks: [{name, passed, detail, figures}], dtype, tolerances}``; raises
        OutputError (exit 2) when there is no manifest.
    """
    path = Path(path)
    manifest = read_manifest(path)
    kind = manifest.get("kind") if isinstance(manifest, dict) else None
    if kind in ("extract", "fuse"):  # a LoRA extracted from a fine-tune, or a model with a LoRA fused in
        from .verify_model import verify_extract, verify_fuse

        tol = TOLERANCES.get((manifest.get("output") or {}).get("dtype") or "fp32", TOLERANCES["bf16"])
        try:
            return (verify_extract if kind == "extract" else verify_fuse)(path, manifest, tol, progress)
        except (KeyError, TypeError) as e:
            raise OutputError(f"{path / 'vecmerge.json'}: not a complete {kind} manifest (missing or malformed "
                              f"{e}); it was edited or truncated, write the output again") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("recipe"), dict) or "output" not in manifest:
        raise OutputError(f"{path / 'vecmerge.json'}: lacks 'recipe' or 'output'; not a vecmerge manifest")
    dtype = (manifest.get("output") or {}).get("dtype", "fp32")
    tol = TOLERANCES.get(dtype, TOLERANCES["bf16"])
    checks = [input_check(manifest)]
    ev = None
    if checks[0]["passed"]:
        try:
            ev, rc = recompute(manifest, path, progress)
        except VecmergeError as e:
            rc = check("recompute", False, f"the manifest's recipe does not re-evaluate: {e}")
        checks.append(rc)
    else:
        checks.append(not_run("recompute", "an input is missing or changed (see inputs)"))
    out, opened = open_output(path, manifest)
    checks += opened
    expected = None
    if out is None:
        checks.append(not_run("update", "the output cannot be opened"))
    else:
        base_cfg = None
        if ev is not None:
            base_cfg = LoraConfig.read(Path(ev.inputs[ev.base_name].path) / CONFIG_NAME)
        checks += config_checks(out, manifest, base_cfg)
        if ev is not None:
            more, expected = compare(out, ev, manifest, tol, progress)
            checks += more
            if not ev.recipe.rank_policy.lossless:
                expected = None
        else:
            checks.append(not_run("update", "nothing to compare with: the recipe was not re-evaluated"))
    if base_model is not None:
        if out is None:
            checks.append(not_run("peft load", "the output cannot be opened"))
        else:
            checks += peft_checks(path, out, Path(base_model), expected, tol, progress)
    return result(str(path), checks, kind="output", dtype=dtype, tolerances=tol,
                  recipe={k: manifest["recipe"].get(k) for k in ("base", "dir", "rank", "multiple")})


def verify_identities(adapters: list, progress=None) -> dict:
    """Algebraic identities of adapters that have no manifest (see ``verify_adapter``).

    Args:
        adapters (list[Adapter]): opened adapters. progress: optional iterable wrapper (tqdm).

    Returns:
        ``{target, passed, checks, kind: "identities", adapters: [paths]}``.
    """
    checks = identity_checks(list(adapters), progress)
    return result("; ".join(a.name for a in adapters), checks, kind="identities",
                  adapters=[str(a.path) for a in adapters])
