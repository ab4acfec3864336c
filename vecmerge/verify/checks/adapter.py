"""Checks of one adapter folder on its own: opening, hashes, PEFT config, and algebraic identities.

``open_output`` / ``config_checks`` serve ``verify_output`` (an output against its manifest);
``identity_checks`` serves ``vecmerge verify --identities`` (any adapter, no manifest). For an adapter
x with modules x_m (float64 factored algebra, tolerance ``IDENTITY_RTOL`` = 1e-9 relative; observed
~1e-14):

- ``||x_m||^2 = <x_m, x_m>``            (QR-core norm against the Gram inner product)
- ``x_m - x_m = 0``                     (``||x_m - x_m|| <= rtol ||x_m||``)
- ``(a_m + b_m) - b_m = a_m``           (b: the next adapter when combinable, else 2a;
                                        ``<= rtol (||a_m|| + ||b_m||)``)
- ``refactor(x_m, exact) = x_m``        (``<= EXACT_REFACTOR_RTOL`` = 1e-8: exact drops <= 1e-9)
- scale rule: the scale read equals PEFT's ``alpha/r`` (``alpha/sqrt(r)`` with rsLoRA) for the
  (r, alpha) that rank_pattern / alpha_pattern resolve, and r equals the stored rank
- dense against factored on ``DENSE_SAMPLES`` seeded modules: ``||D||_F``, ``<D_a, D_b>_F`` and the
  base-layout ``weight_delta`` against ``B @ A`` formed densely (rtol 1e-10)
"""

from __future__ import annotations

import math
import random
from pathlib import Path

import torch

from ...errors import VecmergeError, few, shown
from ...io.parse import short
from ...linalg.rank_policy import RankPolicy
from ...linalg.rankcut import cut
from ...peft.adapter import Adapter
from ...peft.format import CONFIG_NAME, pattern_key, peft_scale, targeted
from ...peft.params import param_targeted
from ...workspace.taskvector import TaskVector
from ..digests import digest
from ..report import check, within

IDENTITY_RTOL = 1e-9
EXACT_REFACTOR_RTOL = 1e-8
DENSE_RTOL = 1e-10
DENSE_SAMPLES = 3


def open_output(path: Path, manifest: dict) -> tuple[Adapter | None, list[dict]]:
    """Open OUT (a failure is a check that names the culprit); sha256s equal the manifest's; factors finite.

    Args:
        path (Path): the output folder. manifest (dict): its vecmerge.json.

    Returns:
        (the Adapter, or None when it cannot be opened; the checks).
    """
    want = manifest.get("output") or {}
    try:
        out = Adapter(path)
    except VecmergeError as e:
        return None, [check("output opens", False, str(e))]
    checks = [check("output opens", True, f"{out.weights_path.name}: {len(out.modules)} LoRA modules")]
    got, got_cfg = digest(out.weights_path, lambda: out.sha256), out.config_sha256  # once per verify call
    problems = []
    if got != want.get("sha256"):
        problems.append(f"{out.weights_path} has sha256 {got[:16]}..., the manifest says "
                        f"{str(want.get('sha256'))[:16]}...: the weights changed after writing")
    if got_cfg != want.get("config_sha256"):
        problems.append(f"{out.path / CONFIG_NAME} has sha256 {got_cfg[:16]}..., the manifest says "
                        f"{str(want.get('config_sha256'))[:16]}...: the config was edited after writing")
    checks.append(check("output sha256", not problems, "; ".join(problems) or f"weights {got}",
                        {"sha256": got, "config_sha256": got_cfg}))
    bad = []
    for m in out.modules:
        try:
            out.factors(m)
        except VecmergeError as e:
            bad.append(str(e))
    checks.append(check("finite", not bad, few(bad, 3, "; ") or "no NaN/Inf in any factor",
                        {"bad_modules": len(bad)}))
    return out, checks


def config_checks(out: Adapter, manifest: dict, base_config) -> list[dict]:
    """Base model, target coverage, the key set, and each module's ``(r, alpha)`` and scale ``alpha / r``.

    Args:
        out (Adapter): the output. manifest (dict): its vecmerge.json (``modules`` with ranks).
        base_config (LoraConfig | None): the base input's config (its base model), if known.
    """
    raw, cfg = out.config.raw, out.config
    recorded = manifest.get("modules") or {}
    problems = []
    if base_config is not None and cfg.base_model != base_config.base_model:
        problems.append(f"base_model_name_or_path is {cfg.base_model!r}, the base input's is "
                        f"{base_config.base_model!r}")
    if cfg.use_rslora:
        problems.append("use_rslora is on, but vecmerge writes alpha/r scales")
    try:
        untargeted = [m for m, s in out.specs.items()
                      if not (param_targeted(raw, s.target) if s.param else targeted(raw, m, out.path / CONFIG_NAME))]
    except VecmergeError as e:  # a bad regex or type in the coverage keys
        untargeted = []
        problems.append(str(e))
    if untargeted:
        problems.append(f"target_modules {short(raw.get('target_modules'))} misses {few(untargeted)}")
    if raw.get("modules_to_save"):
        problems.append(f"modules_to_save {raw['modules_to_save']!r} would replace base weights")
    conf = check("config", not problems,
                 "; ".join(problems) + f" in {out.path / CONFIG_NAME}" if problems else
                 f"plain LoRA for {shown(cfg.base_model)}; target_modules cover all {len(out.modules)} modules",
                 {"base_model": cfg.base_model, "target_modules": str(raw.get("target_modules"))})
    missing, extra = sorted(set(recorded) - set(out.modules)), sorted(set(out.modules) - set(recorded))
    why = ([f"missing {few(missing)}"] if missing else []) + ([f"unexpected {few(extra)}"] if extra else []) \
        + ([f"base-layer copies {few(out.base_layer_copies)}"] if out.base_layer_copies else [])
    keys = check("key set", not why, "; ".join(why) + f" in {out.weights_path}" if why else
                 f"lora_A and lora_B of exactly the manifest's {len(recorded)} modules",
                 {"modules": len(out.modules), "recorded": len(recorded)})
    bad, scales = [], set()
    for m, spec in out.specs.items():
        r, alpha = cfg.resolve(spec.target)
        want = recorded.get(m, {}).get("rank", spec.rank)
        scale = peft_scale(alpha, r, cfg.use_rslora)
        if r != spec.rank or r != want:
            bad.append(f"{m}: the config resolves r={r}, the tensors have {spec.rank}, the manifest {want}")
        elif not math.isfinite(scale) or scale == 0.0:
            bad.append(f"{m}: lora_alpha {alpha!r} gives scale {scale!r}")
        scales.add(scale)
    ranks = check("ranks and scales", not bad, few(bad, 4, "; ") + f" ({out.path / CONFIG_NAME})" if bad else
                  f"rank_pattern ({len(cfg.rank_pattern)} keys) and alpha_pattern ({len(cfg.alpha_pattern)}) "
                  f"resolve to the stored ranks; PEFT applies {cfg.scale_rule}",
                  {"r": cfg.r, "lora_alpha": cfg.lora_alpha, "scales": sorted(scales)[:8]})
    return [conf, keys, ranks]



# -- identities of adapters without a manifest ----------------------------------------------------
def _combinable(x: TaskVector, y: TaskVector) -> bool:
    return set(x.modules) == set(y.modules) and all(x[m].shape == y[m].shape for m in x.modules)


def _worst(values: dict) -> tuple[str | None, float]:
    m = max(values, key=lambda k: values[k], default=None)
    return m, (values[m] if m is not None else 0.0)


def _law(name: str, values: dict, tol: float, what: str) -> dict:
    """A check that every module's relative residual in ``values`` is at most ``tol``."""
    m, worst = _worst(values)
    bad = [k for k, v in values.items() if not within(v, tol)]
    return check(name, not bad, (f"{len(bad)}/{len(values)} modules break {what}, worst {m}: {worst:.3e} > {tol:g}"
                                 if bad else f"{what} in {len(values)} modules, worst {worst:.2e} <= {tol:g}"),
                 {"max_rel_error": worst, "worst_module": m, "tolerance": tol, "bad_modules": bad[:20]})


def scale_rule_check(label: str, a: Adapter) -> dict:
    """``scale_m == alpha_m / r_m`` (``/ sqrt(r_m)`` with rsLoRA) for PEFT's resolved (r, alpha); r = stored rank.

    Args:
        label (str): name in the check. a (Adapter): the adapter.
    """
    cfg, bad, dead = a.config, [], []
    for m, spec in a.specs.items():
        r, alpha = cfg.resolve(spec.target)
        want = peft_scale(alpha, r, cfg.use_rslora)
        if r != spec.rank or not want == spec.scale or not math.isfinite(want):
            bad.append(f"{m}: r={r} alpha={alpha!r} -> {want!r}, read {spec.scale!r} at rank {spec.rank}")
    for key in (*cfg.rank_pattern, *cfg.alpha_pattern):
        if not any(pattern_key([key], s.target) for s in a.specs.values()):
            dead.append(key)
    scales = sorted({s.scale for s in a.specs.values()})
    note = f"; pattern keys matching no module: {few(dead)}" if dead else ""
    return check(f"scale rule [{label}]", not bad, few(bad, 3, "; ") or
                 f"{cfg.scale_rule} with r={cfg.r}, lora_alpha={cfg.lora_alpha:g}, {len(cfg.rank_pattern)} rank "
                 f"and {len(cfg.alpha_pattern)} alpha patterns resolve as stored{note}",
                 {"rule": cfg.scale_rule, "scales": scales[:8], "unused_pattern_keys": dead})


def dense_check(label: str, a: Adapter, x: TaskVector, y: TaskVector, seed: int = 0) -> dict:
    """Dense ``B @ A`` against the factored ``||x_m||`` and ``<x_m, y_m>`` on a few seeded modules.

    Args:
        label (str): name in the check. a (Adapter): the adapter. x, y (TaskVector): it and its partner.
        seed (int): which modules are sampled.
    """
    names = sorted(x.modules)
    picked = sorted(random.Random(seed).sample(names, min(DENSE_SAMPLES, len(names))))
    errs = {}
    for m in picked:
        dx, dy = x[m].dense(), y[m].dense()
        nx, ny = float(torch.linalg.norm(dx)), float(torch.linalg.norm(dy))
        layout = a.weight_delta(m)
        want = dx.T if a.specs[m].transposed else dx
        scale = max(nx, 1e-300)
        errs[m] = max(abs(nx - x[m].norm()) / scale,
                      abs(float((dx * dy).sum()) - x[m].inner(y[m])) / max(nx * ny, 1e-300),
                      float(torch.linalg.norm(layout - want)) / scale if layout.shape == want.shape else math.inf)
    return _law(f"dense = factored [{label}]", errs, DENSE_RTOL, f"dense norms/inner products ({few(picked)})")


def identity_checks(adapters: list[Adapter], progress=None, labels: list[str] | None = None) -> list[dict]:
    """All identities of the module docstring for each adapter (see there for tolerances).

    Args:
        adapters (list[Adapter]): opened adapters. progress: optional iterable wrapper (tqdm).
        labels (list[str] | None): names to show (workspace names); default: the folder names.
    """
    checks, vecs = [], {}
    for i, a in enumerate(adapters):
        name = labels[i] if labels is not None else a.name
        label = name if name not in vecs else f"{name}#{i + 1}"
        try:
            vecs[label] = (a, TaskVector.from_adapter(a))
            checks.append(check(f"finite [{label}]", True, f"{len(a.modules)} modules, no NaN/Inf",
                                {"path": str(a.path), "sha256": a.sha256}))
        except VecmergeError as e:
            checks.append(check(f"finite [{label}]", False, str(e), {"path": str(a.path)}))
    labels = list(vecs)
    for i, lab in enumerate(labels):
        a, x = vecs[lab]
        other = labels[(i + 1) % len(labels)] if len(labels) > 1 else None
        if other is not None and _combinable(x, vecs[other][1]):
            y, ylab = vecs[other][1], other
        else:
            y, ylab = x * 2.0, f"2*{lab}"
        gram, zero, assoc, refac = {}, {}, {}, {}
        for m in progress(x.names()) if progress else x.names():
            xm, ym = x[m], y[m]
            n = xm.norm()
            gram[m] = abs(n * n - xm.inner(xm)) / (n * n) if n > 0 else abs(xm.inner(xm))
            zero[m] = (xm - xm).norm() / n if n > 0 else (xm - xm).norm()
            assoc[m] = ((xm + ym) - ym - xm).norm() / max(n + ym.norm(), 1e-300)
            rf = cut(xm, RankPolicy("exact")).factors
            refac[m] = (rf - xm).norm() / n if n > 0 else rf.norm()
        checks += [_law(f"||x||^2 = <x,x> [{lab}]", gram, IDENTITY_RTOL, "||x||^2 = <x,x>"),
                   _law(f"x - x = 0 [{lab}]", zero, IDENTITY_RTOL, "x - x = 0"),
                   _law(f"(a + b) - b = a [{lab}]", assoc, IDENTITY_RTOL, f"(a + b) - b = a with b = {ylab}"),
                   _law(f"exact refactor [{lab}]", refac, EXACT_REFACTOR_RTOL, "refactor(x, exact) = x"),
                   scale_rule_check(lab, a), dense_check(lab, a, x, y)]
    return checks
