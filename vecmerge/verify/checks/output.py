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
  ``exact``) instead is I_m cut on W_m's own columns (``||W_m - P_W I_m|| <= tol ||I_m||``, first order in
  any edit) and reproduces its recorded per-module error within that tolerance;
- step: ``survival = sum_m <W_m - base_m, step_m> / ||step||^2`` within ``TOLERANCES[dtype]["survival"]``
  of 1 (of the recorded value for a rank-cut output); it fails when no module could be compared
  (both in ``update.compare_to_recomputed``); update, step and bias run only where verify's own path did not
  compare every module (``own_path_compared``: a recipe it does not cover, a derivation that failed) or for the
  PEFT checks of ``--base-model`` on a lossless output: elsewhere the ``independent`` row is the update's check;
- files, figures, manifest (``verify_manifest``): the folder holds only what vecmerge writes and the
  model card as pinned; every figure and field of the manifest recomputes (``FIGURES_RTOL``), so an
  edited ``figures.dtype_effect``, ``modules[m].survival`` or ``resolved.realized`` fails by name.

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

import dataclasses
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import OutputError, UsageError, VecmergeError, few, shown
from ...outputs.manifest import TOLERANCES, read_manifest, shape_problems
from ...peft.adapter import Adapter
from ...peft.format import CONFIG_NAME, LoraConfig
from ...pipeline import evaluate
from ...pipeline.build import build_output
from ...pipeline.evaluation import Evaluation
from ...pipeline.manifest import manifest_figures, merge_formula, resolved_for
from ...recipe.load import manifest_root, with_absolute_inputs
from ...recipe.recipe import Recipe
from ...workspace.base_model import folder_is, model_folder_problem
from ...workspace.names import Workspace
from ..digests import digest, one_call
from ..independent.independent import independent_check
from ..independent.references import Uncovered
from ..report import VerifyReport, check, close, not_run, result
from .adapter import config_checks, identity_checks, open_output
from .files import figures_check, files_check, manifest_check
from .peft_load import peft_checks
from .update import compare_to_recomputed

ALPHA_RTOL = 1e-9       # alpha is a ratio of float64 norms: reproduces to round-off


# -- inputs and the re-derivation -----------------------------------------------------------------
def input_check(manifest: dict, where: str = "") -> dict:
    """Every input the manifest pins exists and hashes as recorded: ``sha256(weights) == pin``, same for config.

    Args:
        manifest (dict): the output's vecmerge.json (input paths made absolute).
        where (str): how the relative input paths were resolved (``--workspace``), said in the detail; empty:
            from the output folder, and a missing input of a manifest with relative paths says to pass it.
    """
    pinned = manifest["recipe"].get("inputs") or {}
    conf = manifest.get("inputs") or {}
    if not isinstance(pinned, dict) or not isinstance(conf, dict):
        return check("inputs", False, "the manifest's recipe.inputs and inputs must map names to {path, sha256}")
    problems, figs = [], {}
    for name, entry in pinned.items():
        if not isinstance(entry, dict) or not isinstance(entry.get("path"), str):
            problems.append(f"input {name}: the manifest records no path")
            continue
        p = Path(entry["path"]).resolve()
        try:
            a = Adapter(p, modules_to_save=manifest["recipe"].get("modules_to_save", "refuse"),
                        dora=manifest["recipe"].get("base_model") is not None)  # DoRA inputs read against it
        except VecmergeError as e:
            problems.append(f"input {name} is missing or unreadable: {e}")
            continue
        sha = digest(a.weights_path, partial(getattr, a, "sha256"))  # kept for verify's own path (once per call)
        if sha != entry.get("sha256"):
            problems.append(f"input {name}: {a.weights_path} has sha256 {sha[:16]}..., the manifest pins "
                            f"{str(entry.get('sha256'))[:16]}...: it changed after the merge")
        entry_conf = conf.get(name)
        pin = entry_conf.get("config_sha256") if isinstance(entry_conf, dict) else None
        if pin and a.config_sha256 != pin:
            problems.append(f"input {name}: {p / CONFIG_NAME} changed after the merge (sha256 "
                            f"{a.config_sha256[:16]}..., pinned {pin[:16]}...)")
        figs[name] = sha
    if not pinned:
        problems.append("the manifest pins no inputs")
    missing = any("is missing or unreadable" in p for p in problems)
    if where:
        problems = [f"{p} (input paths resolved against {where})" for p in problems[:1]] + problems[1:]
    elif missing and isinstance(manifest.get("workspace"), str):
        problems.insert(0, "the input paths are relative to the workspace the output was made in: if the output "
                        "was moved or copied, pass --workspace PATH/vecmerge.yaml of that workspace")
    return check("inputs", not problems, "; ".join(problems) or
                 f"{len(pinned)} inputs hash as pinned: {', '.join(pinned)}" + (f" (paths resolved against {where})"
                                                                                if where else ""), figs)


def _protected(ev, base_model, progress=None):
    """A protected recipe's evaluation with the pipeline's own projection (the non-independent path)."""
    from types import SimpleNamespace

    from ...pipeline.protection import capture, energies, protect

    if base_model is None:
        raise UsageError("the output is a protected step: pass --base-model")
    ws: Any = SimpleNamespace(base_model=Path(base_model))  # capture reads only the workspace's base model
    cap = capture(ev, ws, progress)
    return protect(ev, cap, energies(ev.recipe)[0])


def recompute(manifest: dict, root: Path, progress=None, base_model=None) -> tuple[Evaluation, dict]:
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
    if recipe.protect:
        ev = _protected(ev, base_model or recipe.base_model, progress)
    if ev.step is None:
        what = recipe.base if recipe.base is not None else merge_formula(manifest["recipe"])
        return ev, check("recompute", True, f"re-evaluated {what!r} ({ev.method.name}) from the inputs")
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
    dropped = res.get("dropped_by_consensus", res.get("dropped")) or []  # "dropped" in manifests of vecmerge 0.1.0
    if sorted(ev.dropped) != sorted(dropped):
        problems.append(f"consensus drops [{few(ev.dropped)}], the manifest recorded [{few(dropped)}]")
    if "zeroed_by_method" in res and sorted(ev.zeroed) != sorted(res["zeroed_by_method"] or []):
        problems.append(f"the method gives no step to [{few(ev.zeroed)}], the manifest recorded "
                        f"[{few(res['zeroed_by_method'] or [])}]")
    what = f"alpha = {figs['alpha']!r}" if "alpha" in figs else "every module's alpha"
    return ev, check("recompute", not problems, "; ".join(problems) or
                        f"{what} as recorded (rel {ALPHA_RTOL:g})", figs)


def rebuilt_figures(ev) -> dict:
    """``{"figures", "modules"}`` as the pipeline writes them into the manifest, rebuilt from the recomputed
    recipe (the same cut and rounding, so every key is accounted for: merges, experts, cuts). Each module's
    tensors are dropped as soon as they are made (but for ``target_parameters`` experts, packed at the end)."""
    params = any(s.param for s in ev.specs.values())
    built = build_output(ev, ev.recipe.multiple, sink=None if params else _discard)
    figs, mods = manifest_figures(built.figures)
    return {"figures": figs, "modules": mods}


def _discard(module: str, tensors: dict) -> None:
    """A ``build_output`` sink that keeps nothing (only the figures are wanted)."""

def independent_rows(path: Path, manifest: dict, tol: dict, inputs_ok: bool, opened: bool, base_model=None
                     ) -> tuple[list[dict], str | None]:
    """``([the independent check], None)``, or ``([], why)`` for a recipe verify's own path does not cover; a
    protected step adds its ``protection`` check (``verify.independent.protected``), or says it was not re-derived."""
    prot = manifest["recipe"].get("protect")
    base_model = base_model or manifest["recipe"].get("base_model")
    if prot and base_model is None:
        return [not_run("protection", "protected step not re-derived: it depends on the base model's activations; "
                        "pass --base-model FOLDER (or base_model: in vecmerge.yaml)")], None
    if not inputs_ok:
        return [not_run("independent", "an input is missing or changed (see inputs)")], None
    if not opened:
        return [not_run("independent", "the output cannot be opened")], None
    try:
        with np.errstate(over="raise", invalid="raise", divide="raise"):
            if prot:
                return protected_rows(path, manifest, tol, Path(base_model)), None
            return [independent_check(path, manifest, tol)], None
    except (FloatingPointError, OverflowError) as e:
        return [check("independent", False, f"the recipe does not recompute within float64's range ({e}): an edited "
                      "or absurd coefficient")], None
    except Uncovered as e:
        return [], (f"the update was not re-derived by verify's own path ({e}); the update check re-evaluates "
                    "the recipe through the method's own code")
    except (VecmergeError, ValueError, KeyError, TypeError) as e:
        return [check("independent", False, f"verify's own derivation cannot read the recipe, the output or its "
                      f"inputs: {e}")], None


def protected_rows(path: Path, manifest: dict, tol: dict, base_model: Path) -> list[dict]:
    """A protected step re-derived by verify's own hooks and numpy: ``[independent, protection]``."""
    from ..independent.protected import protection_check, protector
    from .protected_capture import capture_inputs

    r = manifest["recipe"]
    files = {**(r.get("protect") or {}), **(r.get("target") or {})}
    recorded = manifest.get("protection")
    sketch = recorded.get("inputs") if isinstance(recorded, dict) else None
    info: dict = {}
    fn, state = protector(r, lambda backbone, modules: capture_inputs(base_model, backbone, files, modules,
                                                                      sketch if isinstance(sketch, dict) else None,
                                                                      info))
    rows = []
    row = independent_check(path, manifest, tol, protector=fn,
                            after=lambda d: rows.append(protection_check(d, r, recorded, {**state, "sketched": info})))
    return [row, *rows]


def base_model_check(base_model: Path, out: Adapter | None, manifest: dict, allow: bool = False,
                     aliases: dict | None = None, root: Path | None = None) -> dict:
    """``--base-model`` is the model the output declares: the output's ``base_model_name_or_path``, or
    the base model one of its inputs declares (``workspace.base_model.folder_is``).

    Args:
        base_model (Path): the local model folder given. out (Adapter | None): the output, opened.
        manifest (dict): vecmerge.json (its inputs record their declared base models).
        allow (bool): ``--allow-base-mismatch``: pass, saying loudly that it is another model.
        aliases (dict | None): local folder -> hub id (the workspace's ``base_model`` and ``base_model_id``).
        root (Path | None): the workspace the output was made in (a relative declared path starts there).
    """
    declared = [out.config.base_model] if out is not None else []
    declared += [i.get("base_model") for i in (manifest.get("inputs") or {}).values() if isinstance(i, dict)]
    declared = [str(d) for d in dict.fromkeys(declared) if d]
    if any(folder_is(base_model, d, aliases, [root] if root else []) for d in declared):
        return check("base model", True, f"{shown(base_model)} is the base model the output declares",
                     {"declared": declared})
    said = (f"{shown(base_model)} is NOT the base model the output declares "
            f"({few([shown(d) for d in declared]) or 'none declared'})")
    if allow:
        return check("base model", True, f"{said}; checked against it anyway (--allow-base-mismatch)",
                     {"declared": declared, "mismatch_allowed": True})
    return check("base model", False, f"{said}; give that model with --base-model, or pass --allow-base-mismatch "
                 "if this folder really holds the same weights", {"declared": declared})


def own_path_compared(rows: list[dict]) -> bool:
    """Whether verify's own path compared every module (an ``independent`` row with its figures, passed or
    failed): the pipeline's ``update``/``step``/``bias`` re-evaluation then adds nothing it would catch."""
    return any(r["name"] == "independent" and r["passed"] is not None and "modules" in r["figures"] for r in rows)


def verify_output(path, base_model=None, progress=None, *, allow_base_mismatch: bool = False,
                  base_model_aliases: dict | None = None, workspace: Path | None = None) -> VerifyReport:
    """Re-derive the output at ``path`` from its manifest and run every check (see the module docstring).

    Args:
        path (str | Path): an output folder with ``vecmerge.json``.
        base_model (str | Path | None): a local ``transformers`` model folder: also load through PEFT
            (after checking that it is the model the output declares, see ``base_model_check``).
        progress: optional callable wrapping iterables (tqdm).
        allow_base_mismatch (bool): run the PEFT checks on a base model the output does not declare.
        base_model_aliases (dict | None): local folder -> hub id, e.g. the workspace's pair.
        workspace (Path | None): the folder the manifest's relative input paths start from (``--workspace``'s
            folder: an output moved or copied out of its workspace); None: the manifest's own pointer.

    Returns:
        ``{target, passed, checks: [{name, passed, detail, figures}], dtype, tolerances}``; raises
        OutputError (exit 2) when there is no manifest.
    """
    with one_call():  # each file hashed once in this call (inputs and output: by their checks, not again)
        return _verify_output(Path(path), base_model, progress, allow_base_mismatch, base_model_aliases, workspace)


def _verify_output(path: Path, base_model, progress, allow_base_mismatch: bool, base_model_aliases: dict | None,
                   workspace: Path | None) -> VerifyReport:
    """``verify_output``'s checks, inside one digest cache."""
    manifest = read_manifest(path)
    kind = manifest.get("kind") if isinstance(manifest, dict) else None
    if workspace is not None and isinstance(manifest, dict) and isinstance(manifest.get("workspace"), str):
        manifest = {**manifest, "workspace": str(Path(workspace).resolve())}  # the output moved: --workspace
    if kind in ("extract", "fuse"):  # a LoRA extracted from a fine-tune, or a model with a LoRA fused in
        from .models import verify_extract, verify_fuse

        tol = TOLERANCES.get((manifest.get("output") or {}).get("dtype") or "fp32", TOLERANCES["bf16"])
        try:
            manifest = with_absolute_inputs(manifest, path)  # paths relative to the workspace (absolute before)
            return (verify_extract if kind == "extract" else verify_fuse)(path, manifest, tol, progress)
        except (KeyError, TypeError) as e:
            raise OutputError(f"{path / 'vecmerge.json'}: not a complete {kind} manifest (missing or malformed "
                              f"{e}); it was edited or truncated, write the output again") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("recipe"), dict) or "output" not in manifest:
        raise OutputError(f"{path / 'vecmerge.json'}: lacks 'recipe' or 'output'; not a vecmerge manifest")
    bad = shape_problems(manifest)
    if bad:
        raise OutputError(f"{path / 'vecmerge.json'}: {bad[0]}; not a manifest vecmerge wrote (edited?), "
                          "re-run its recipe")
    where = f"--workspace {Path(workspace).resolve()}" if workspace is not None and isinstance(manifest.get(
        "workspace"), str) else ""
    manifest = with_absolute_inputs(manifest, path)  # input paths are stored relative to the workspace
    problem = model_folder_problem(base_model) if base_model is not None else None
    if problem:
        raise UsageError(f"--base-model {base_model}: {problem}; give the local transformers model folder "
                         "the adapter was trained on")
    dtype = manifest["output"].get("dtype", "fp32")
    tol = TOLERANCES.get(dtype, TOLERANCES["bf16"])
    checks = [input_check(manifest, where)]
    ev = None
    if checks[0]["passed"]:
        try:
            ev, rc = recompute(manifest, path, progress, base_model)
        except VecmergeError as e:
            rc = check("recompute", False, f"the manifest's recipe does not re-evaluate: {e}")
        checks.append(rc)
    else:
        checks.append(not_run("recompute", "an input is missing or changed (see inputs)"))
    out, opened = open_output(path, manifest)
    checks += opened
    indep, uncovered = independent_rows(path, manifest, tol, checks[0]["passed"], out is not None, base_model)
    checks.append(files_check(path, manifest))
    expected = None
    if out is None:
        checks.append(not_run("update", "the output cannot be opened"))
    else:
        base_cfg = None
        if ev is not None:
            base_cfg = LoraConfig.read(Path(ev.inputs[ev.base_name].path) / CONFIG_NAME,
                                       dora=ev.recipe.base_model is not None)
            if ev.recipe.base_model_id:  # the output names the base model by this hub id
                base_cfg = dataclasses.replace(base_cfg, base_model=ev.recipe.base_model_id)
        checks += config_checks(out, manifest, base_cfg)
        if ev is not None:
            keep = base_model is not None and ev.recipe.rank_policy.lossless
            try:
                more: list[dict] = []  # where verify's own path compared: its row checks update, step, bias
                if keep or not own_path_compared(indep):
                    more, expected = compare_to_recomputed(out, ev, manifest, tol, progress, keep_expected=keep)
                more.append(figures_check(manifest, rebuilt_figures(ev)))
            except VecmergeError as e:  # the recomputation leaves float64's range (an edited trust, alpha...)
                more = [check("update", False, f"the recipe does not recompute: {e}"),
                        not_run("figures", "the recipe does not recompute (see update)")]
            checks += more
        else:
            checks.append(not_run("update", "nothing to compare with: the recipe was not re-evaluated"))
    if ev is None or out is None:
        checks.append(not_run("figures", "nothing to recompute them from (see above)"))
    checks += indep
    if ev is not None:
        resolved = resolved_for(ev, ev.recipe.multiple, manifest.get("modules"))
        checks.append(manifest_check(manifest, ev, out, resolved))
    else:
        checks.append(not_run("manifest", "the recipe was not re-evaluated (see above)"))
    if base_model is not None:
        same = base_model_check(Path(base_model), out, manifest, allow_base_mismatch, base_model_aliases,
                                manifest_root(path, manifest) if "workspace" in manifest else None)
        checks.append(same)
        if out is None:
            checks.append(not_run("peft load", "the output cannot be opened"))
        elif not same["passed"]:
            checks.append(not_run("peft load", "the base model is not the one the output declares (see base model)"))
        else:
            checks += peft_checks(path, out, Path(base_model), expected, tol, progress)
    return result(str(path), checks, kind="output", dtype=dtype, tolerances=tol,
                  recipe={k: manifest["recipe"].get(k) for k in ("base", "dir", "rank", "multiple")},
                  **({"not_independent": uncovered} if uncovered else {}))


def verify_identities(adapters: list, progress=None, labels: list[str] | None = None) -> VerifyReport:
    """Algebraic identities of adapters that have no manifest (see ``verify_adapter``).

    Args:
        adapters (list[Adapter]): opened adapters. progress: optional iterable wrapper (tqdm).
        labels (list[str] | None): what the user called them (workspace names); default: folder names.

    Returns:
        ``{target, passed, checks, kind: "identities", adapters: [paths]}``.
    """
    labels = list(labels) if labels is not None else [a.name for a in adapters]
    checks = identity_checks(list(adapters), progress, labels)
    return result("; ".join(labels), checks, kind="identities", adapters=[str(a.path) for a in adapters])
