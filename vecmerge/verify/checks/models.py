"""``vecmerge verify`` of an ``extract`` or a ``fuse`` output: re-derived from the models it was made from.

Extract output OUT (manifest ``kind: extract``), for every module m with ``D_m = W_tuned - W_base``
re-read from both models (float64, LoRA layout) and ``W_m = scale * B @ A`` read back from OUT:

- inputs: every file of both models hashes as the manifest recorded;
- output: opens as PEFT LoRA (modules_to_save allowed); weights and config sha256 as recorded;
- config: base_model_name_or_path, target_modules covering every module, modules_to_save equal to the
  recorded saved modules, fan_in_fan_out as the layouts need, no rsLoRA; each module's (r, alpha) as
  PEFT resolves it equal to the stored rank and recorded alpha; the key set equal to the manifest's;
- update: ``| ||D_m - W_m|| / ||D_m|| - recorded rel_error | <= tol`` (``outputs.manifest.TOLERANCES[dtype]
  ["update"]``: the recorded error is the cut's, before the factors were rounded to the output dtype);
- saved: every saved tensor equal, bit for bit, to the fine-tune's;
- others: the differing tensors outside the targets, listed again from both models, equal the
  manifest's list (nothing differing went unmentioned).

Fuse output OUT (``kind: fuse``), every tensor against the base and the adapter:

- inputs: the base's files, the adapter's weights and config hash as recorded; output files likewise;
- fused: ``|out - (W + D)| <= eps(dtype) |W + D| + tiny`` elementwise (one ulp: the sum rounded once),
  with ``W + D`` formed here in float64 from the base weight and ``scale * B @ A``;
- saved and copied: modules_to_save tensors equal the adapter's, every other tensor equals the base's
  (byte for byte when its dtype is kept);
- copies: the base's other files copied unchanged (config.json: only the recorded dtype edits).

Both kinds: ``files`` (``verify.checks.files.files_check``): the folder holds exactly what the writer writes (fuse: the
shards, the index when sharded, the base's other files, vecmerge.json, README.md; extract: the adapter's files and
the tokenizer files the manifest lists), anything else failing by name, dotfiles and folders included, and
README.md as pinned; ``figures`` (``verify.checks.model_figures``): every number of ``modules`` and ``figures``
recomputed from what was measured here.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ...errors import VecmergeError, few
from ...io.hashing import sha256_file
from ...io.model_folder import CONFIG, INDEX_NAME, ModelFolder
from ...io.parse import ParseError, load_json
from ...io.safetensors_read import to_tensor
from ...outputs.card import CARD_NAME
from ...outputs.manifest import MANIFEST_NAME
from ...peft.adapter import Adapter
from ...peft.format import CONFIG_NAME, DTYPES, PREFIX, targeted
from ...peft.write import OUTPUT_FILES
from ..report import VerifyReport, check, not_run, result, within
from .files import files_check
from .model_figures import extract_figures, fuse_figures

DTYPE_NAMES = {v: k for k, v in DTYPES.items()}  # a stored dtype's tolerance row (float64: fp32's)


def _hash_check(name: str, recorded: dict, got: dict, what: str) -> dict:
    off = [f"{n}: sha256 {str(got.get(n))[:16]}..., recorded {str(h)[:16]}..." for n, h in recorded.items()
           if got.get(n) != h]
    off += [f"{n}: not recorded" for n in got if n not in recorded]
    return check(name, not off, "; ".join(off[:3]) + f" ({what} changed after the output was written)" if off else
                 f"{len(recorded)} files of {what} hash as recorded", {"files": len(recorded)})


MOVED = ("; the manifest's paths are relative to the workspace the output was made in: if the output was moved "
         "or copied, pass --workspace PATH/vecmerge.yaml of that workspace")


def _open(folder, flag: str):
    try:
        return ModelFolder(folder, flag), None
    except VecmergeError as e:
        hint = MOVED if flag != "output" and not Path(folder).exists() else ""
        return None, check(f"{flag.strip('-')} opens", False, str(e) + hint)


# -- extract ------------------------------------------------------------------------------------
def _extract_config(out: Adapter, man: dict) -> list[dict]:
    raw, cfg, mods = out.config.raw, out.config, man.get("modules") or {}
    problems = []
    hub = (man.get("settings") or {}).get("base_model_id")
    want = hub or str(Path(man["inputs"]["base"]["path"]).resolve())  # the hub id, else the local folder
    if cfg.base_model != want:
        problems.append(f"base_model_name_or_path is {cfg.base_model!r}, the manifest's base is {want!r}")
    if cfg.use_rslora:
        problems.append("use_rslora is on, but extract writes alpha/r scales")
    missed = [m for m in out.modules if not targeted(raw, m)]
    if missed:
        problems.append(f"target_modules misses {few(missed)}")
    saved = sorted((man.get("others") or {}).get("saved_modules") or [])
    if sorted(cfg.modules_to_save) != saved:
        problems.append(f"modules_to_save is {few(cfg.modules_to_save)}, the manifest saved {few(saved)}")
    want_fifo = any(r.get("kind") == "conv1d" for r in mods.values())
    if cfg.fan_in_fan_out != want_fifo:
        problems.append(f"fan_in_fan_out is {cfg.fan_in_fan_out}, the module layouts need {want_fifo}")
    conf = check("config", not problems, "; ".join(problems) + f" in {out.path / CONFIG_NAME}" if problems else
                 f"LoRA of {len(out.modules)} modules for {cfg.base_model}, modules_to_save {len(saved)}")
    bad = []
    for m, spec in out.specs.items():
        r, alpha = cfg.resolve(m)
        rec = mods.get(m, {})
        if r != spec.rank or r != rec.get("written_rank") or alpha != rec.get("alpha"):
            bad.append(f"{m}: the config resolves (r={r}, alpha={alpha}), the tensors have r={spec.rank}, the "
                       f"manifest ({rec.get('written_rank')}, {rec.get('alpha')})")
    want_keys = {PREFIX + t for t in (man.get("others") or {}).get("saved_tensors") or []}
    why = []
    if set(out.modules) != set(mods):
        why.append(f"LoRA modules differ from the manifest's: {few(sorted(set(out.modules) ^ set(mods)))}")
    if set(out.saved_keys) != want_keys:
        why.append(f"saved tensors differ from the manifest's: {few(sorted(set(out.saved_keys) ^ want_keys))}")
    return [conf, check("ranks and scales", not bad, "; ".join(bad[:3]) or "every module's (r, alpha) resolves as "
                        "recorded"), check("key set", not why, "; ".join(why) or
                                           f"{len(mods)} LoRA modules and {len(want_keys)} saved tensors as recorded")]


def _extract_update(out: Adapter, base: ModelFolder, tuned: ModelFolder, man: dict, tol: float, progress,
                    measured: dict) -> list:
    """The ``update`` check; ``measured[m] = (||D||^2, ||D - W|| / ||D||)`` filled for ``figures``."""
    mods, errs, bad, missing = man.get("modules") or {}, {}, [], []
    weights = {f"{m}.weight": m for m in mods}
    order = [n for n in tuned.in_file_order()]
    for name in progress(order) if progress else order:
        b = base.read(name) if name in base.tensors else None
        t = tuned.read(name)
        m = weights.get(name)
        if m is None:
            continue
        if b is None or m not in out.specs:
            missing.append(m)
            continue
        D = t.to(torch.float64) - b.to(torch.float64)
        if mods[m].get("kind") in ("conv1d", "embedding"):
            D = D.T
        W = out.factors(m).dense().to(torch.float64)
        if tuple(W.shape) != tuple(D.shape):
            missing.append(m)
            continue
        n = float(torch.linalg.vector_norm(D))
        rel = float(torch.linalg.vector_norm(D - W)) / n if n > 0 else float(torch.linalg.vector_norm(W))
        errs[m] = rel
        measured[m] = (n * n, rel)
        want = mods[m].get("rel_error")
        if not isinstance(want, (int, float)) or not within(abs(rel - want), tol):
            bad.append(m)
    for name in base.in_file_order():
        if name not in tuned.tensors:
            base.read_bytes(name)
    missing += [m for m in mods if m not in errs and m not in missing]
    worst = max(errs, key=lambda k: errs[k], default=None)
    detail = (f"{len(bad)}/{len(errs)} modules: ||D - W|| / ||D|| differs from the recorded cut error by more than "
              f"{tol:g}, e.g. {bad[0]}: {errs[bad[0]]:.6g}, recorded {mods[bad[0]].get('rel_error')!r}" if bad else
              f"every module's ||D - W|| / ||D|| within {tol:g} of its recorded cut error")
    if missing:
        detail = f"{few(missing)}: missing from the models or the output, or reshaped; " + detail
    return [check("update", not bad and not missing, detail,
                  {"max_rel_error": errs.get(worst), "worst_module": worst, "tolerance": tol,
                   "bad_modules": bad + missing})]


def _extract_saved(out: Adapter, tuned: ModelFolder, man: dict) -> dict:
    bad = []
    names = (man.get("others") or {}).get("saved_tensors") or {}
    keys = set(out.tensor_keys)
    for n, src in names.items():
        if PREFIX + n not in keys or src not in tuned.tensors:
            bad.append(n)
            continue
        info = tuned.info(src)
        want = to_tensor(tuned.files[info.file].read_bytes(info, False), info)
        if not torch.equal(out.tensor(PREFIX + n), want):
            bad.append(n)
    return check("saved", not bad, f"{few(bad)} differ from the fine-tune's tensors" if bad else
                 f"{len(names)} saved tensors equal the fine-tune's bit for bit", {"bad_modules": bad})


def verify_extract(path: Path, man: dict, tol: dict, progress=None) -> VerifyReport:
    """Every check of an extract output (see the module docstring). Returns ``checks.result``."""
    from ...models.extract import find_others
    from ...models.extract_write import TOKENIZER_FILES

    checks = []
    base, fail_b = _open(man["inputs"]["base"]["path"], "--base-model")
    tuned, fail_t = _open(man["inputs"]["tuned"]["path"], "--tuned")
    checks += [c for c in (fail_b, fail_t) if c]
    try:
        out = Adapter(path, modules_to_save="drop")
    except VecmergeError as e:
        out = None
        checks.append(check("output opens", False, str(e)))
    if out is not None:
        want = man.get("output") or {}
        ok = out.sha256 == want.get("sha256") and out.config_sha256 == want.get("config_sha256")
        checks.append(check("output sha256", ok, f"weights {out.sha256}" if ok else
                            f"{out.weights_path.name} or {CONFIG_NAME} changed after writing (sha256 "
                            f"{out.sha256[:16]}..., recorded {str(want.get('sha256'))[:16]}...)"))
        checks += _extract_config(out, man)
    listed = (man.get("output") or {}).get("files")
    copies = [n for n in listed if n in TOKENIZER_FILES] if isinstance(listed, list) else []
    checks.append(files_check(path, man, OUTPUT_FILES + tuple(copies), pin_required=False))
    if out is not None and base is not None and tuned is not None:
        measured: dict = {}
        checks += _extract_update(out, base, tuned, man, tol["update"], progress, measured)
        checks.append(_extract_saved(out, tuned, man))
        target_weights = {f"{m}.weight" for m in man.get("modules") or {}}
        got = sorted((o.tensor, o.kind) for o in find_others(base, tuned, target_weights))
        rec = sorted((t["tensor"], t["kind"]) for t in (man.get("others") or {}).get("tensors") or [])
        checks.append(check("others", got == rec, f"{len(got)} differing tensors outside the targets, as recorded"
                            if got == rec else f"the models differ outside the targets in "
                            f"{few([t for t, _ in sorted(set(got) ^ set(rec))])}, which the manifest lists otherwise"))
        checks.append(extract_figures(man, measured, {m: s.rank for m, s in out.specs.items()}, len(got),
                                      (man.get("output") or {}).get("dtype")))
    else:
        checks.append(not_run("figures", "a model or the output cannot be opened (see above)"))
    for m in (base, tuned):
        if m is not None and (base is None or tuned is None):
            m.close()
    if base is not None and tuned is not None:
        checks.insert(0, _hash_check("inputs", {**_prefixed("base", man["inputs"]["base"]["files"]),
                                                **_prefixed("tuned", man["inputs"]["tuned"]["files"])},
                                     {**_prefixed("base", base.sha256s()), **_prefixed("tuned", tuned.sha256s())},
                                     "the input models"))
        base.close()
        tuned.close()
    return result(str(path), checks, kind="extract output", dtype=(man.get("output") or {}).get("dtype"),
                  tolerances=tol)


def _prefixed(side: str, files: dict) -> dict:
    return {f"{side}/{k}": v for k, v in files.items()}


# -- fuse ---------------------------------------------------------------------------------------
def _fused_ok(got: torch.Tensor, W: torch.Tensor, B, A, scale: float, transposed: bool) -> tuple[float, float, float]:
    """Worst ``|got - (W + D)| / (eps |W + D| + tiny)`` (<= 1: within one ulp of the float64 sum), in row blocks;
    with ``||D||^2`` and ``||got - (W + D)||^2`` (float64) for the manifest's figures."""
    left, right = B.to(torch.float64) * scale, A.to(torch.float64)
    if transposed:
        left, right = right.T, left.T
    fi = torch.finfo(got.dtype)
    worst, d_sq, e_sq, step = 0.0, 0.0, 0.0, max(1, (32 << 20) // (8 * max(W.shape[1], 1)))
    for i in range(0, W.shape[0], step):
        D = left[i:i + step] @ right
        exact = W[i:i + step].to(torch.float64) + D
        bound = fi.eps * exact.abs() + fi.smallest_normal * fi.eps
        err = got[i:i + step].to(torch.float64) - exact
        worst = max(worst, float((err.abs() / bound).max()))
        d_sq += float((D * D).sum())
        e_sq += float((err * err).sum())
    return worst, d_sq, e_sq


def verify_fuse(path: Path, man: dict, tol: dict, progress=None) -> VerifyReport:
    """Every check of a fuse output (see the module docstring). Returns ``checks.result``."""
    from ...models.fuse import SKIPPED_FILES

    checks = []
    base, fail = _open(man["inputs"]["base"]["path"], "--base-model")
    outm, fail_o = _open(path, "output")
    checks += [c for c in (fail, fail_o) if c]
    try:
        a = Adapter(man["inputs"]["adapter"]["path"], modules_to_save="drop")
    except VecmergeError as e:
        a = None
        hint = MOVED if not Path(man["inputs"]["adapter"]["path"]).exists() else ""
        checks.append(check("adapter opens", False, str(e) + hint))
    if a is not None:
        ok = a.sha256 == man["inputs"]["adapter"]["sha256"] and a.config_sha256 == man["inputs"]["adapter"][
            "config_sha256"]
        checks.append(check("adapter", ok, "weights and config hash as recorded" if ok else
                            f"{a.path}: weights or config changed after the fuse"))
    if base is None or outm is None or a is None:
        for m in (base, outm):
            if m is not None:
                m.close()
        return result(str(path), checks, kind="fuse output")
    mods = {r["tensor"]: m for m, r in (man.get("modules") or {}).items()}
    saved = man.get("saved") or {}
    ulps, bad, order, measured = {}, [], outm.in_file_order(), {}
    counts = {"modules": 0, "saved": 0, "copied": 0, "converted": 0, "tensors": len(base.tensors)}
    if set(outm.tensors) != set(base.tensors):
        bad.append(f"tensor names differ from the base's: {few(sorted(set(outm.tensors) ^ set(base.tensors)))}")
    for n in progress(order) if progress else order:
        got = outm.read(n)
        if n not in base.tensors:
            continue
        if n in mods:
            m = mods[n]
            lr = a.factors(m)
            ulps[m], d_sq, e_sq = _fused_ok(got, base.read(n), lr.B, lr.A, lr.scale, a.specs[m].transposed)
            measured[m] = {"tensor": n, "shape": list(base.info(n).shape), "d_sq": d_sq, "e_sq": e_sq,
                           "dtype": DTYPE_NAMES.get(got.dtype, "fp32")}
            counts["modules"] += 1
            if not within(ulps[m], 1.0):
                bad.append(f"{n}: {ulps[m]:.3g} ulp from W + D")
        elif n in saved:
            counts["saved"] += 1
            if not torch.equal(got, a.tensor(saved[n]).to(got.dtype)):
                bad.append(f"{n}: not the adapter's saved tensor")
        else:
            counts["copied" if outm.info(n).dtype == base.info(n).dtype else "converted"] += 1
            b = base.read(n)
            if not torch.equal(got, b.to(got.dtype)):
                bad.append(f"{n}: differs from the base's")
    worst = max(ulps, key=lambda k: ulps[k], default=None)
    checks.append(check("tensors", not bad, "; ".join(bad[:3]) or f"{len(ulps)} fused within one ulp of W + D "
                        f"(float64), {len(saved)} saved, the rest equal to the base's",
                        {"worst_module": worst, "max_ulps": ulps.get(worst), "modules": len(ulps)}))
    files = {f.path.name: f.sha256() for f in outm.files}
    checks.insert(0, _hash_check("output files", man["output"]["files"], files, "the output"))
    checks.insert(0, _hash_check("inputs", man["inputs"]["base"]["files"], base.sha256s(), "the base model"))
    copies = [n for n in base.other_files() if n not in SKIPPED_FILES]
    expected = [f.path.name for f in outm.files] + ([INDEX_NAME] if outm.sharded else []) + copies
    checks.append(files_check(path, man, [*expected, MANIFEST_NAME, CARD_NAME], pin_required=False))
    checks.append(_fuse_files(path, base, man, copies))
    checks.append(fuse_figures(man, measured, counts))
    rec = man.get("modules") or {}
    off = [m for m in rec if m not in ulps]
    checks.append(check("modules", not off, f"{few(off)} recorded but not fused" if off else
                        f"every recorded module ({len(rec)}) was fused"))
    base.close()
    outm.close()
    return result(str(path), checks, kind="fuse output", dtype=man["settings"].get("dtype"), tolerances=tol)


def _fuse_files(path: Path, base: ModelFolder, man: dict, copies: list) -> dict:
    bad = []
    edits = man["output"].get("config_edits") or {}
    listed = man["output"].get("copied_files")
    if listed != copies:
        bad.append(f"output.copied_files is {listed!r}, the base's files to copy are {copies!r}")
    for name in copies:
        if not (path / name).is_file():
            bad.append(f"{name}: missing")
        elif name == CONFIG and edits:
            try:
                cfg = load_json(path / name)
            except ParseError as e:
                bad.append(f"{name}: not readable ({e.problem})")
                continue
            want = {**base.config, **{k: v[1] for k, v in edits.items()}}
            if cfg != want:
                bad.append(f"{name}: differs from the base's beyond the dtype edit")
        elif sha256_file(path / name) != sha256_file(base.path / name):
            bad.append(f"{name}: differs from the base's")
    return check("copies", not bad, "; ".join(bad[:3]) or "the base's config and tokenizer files copied as recorded")


__all__ = ["verify_extract", "verify_fuse"]
