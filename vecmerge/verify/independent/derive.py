"""The intended update re-derived from the manifest by verify's own float64 path: numpy, no pipeline code.

``verify`` must not share the code it checks: a bug in the pipeline (the evaluation, a method, the step, a
rank cut, the writer) must not be a bug in the check. This module recomputes what an output should hold
from the manifest's recorded recipe and its sha256-pinned inputs (read by ``verify.lora_terms``), with its
own arithmetic: every operand of module m is a stack of factors ``X_m = [c_1 s_1 B_1, ...] [A_1; ...]``
(float64 numpy), and

- expressions (``v54``, ``v51 - v28``, ``0.5*(a+b)``) are read by Python's own ``ast``, not ``vecmerge.expr``;
- ``project``: ``dir'_m`` by its mode (add: ``dir_m``; onto-ref: ``max(<dir_m, ref_m>, 0) / ||ref_m||^2 ref_m``;
  orthogonal: ``dir_m - <dir_m, base_m> / ||base_m||^2 base_m``), zero where the consensus drops m
  (``<ref_m, dir_m> < 0``, a module zero within ``ZERO_RTOL`` of its terms having no sign) or
  ``only``/``exclude`` leave it out, times its multiplier; ``alpha = T ||base|| / ||dir'||`` (global norms;
  per module with ``trust_scope: module``; ``--alpha`` clipped to that bound); ``I_m = base_m + k alpha dir'_m``
  for the dose k (``multiple``);
- merges ``linear``, ``svd``, ``cat``: ``I_m = sum_i w_i x_i``; ``task_arithmetic``: ``lambda`` times it
  (over ``sum_i w_i`` with ``normalize``); ``slerp``: ``c0 x0 + c1 x1`` by mergekit's formula (``slerp_weights``,
  the angle per module or over all modules); the spectral merges ``tsv_m``, ``iso_c``, ``iso_cts``, ``svc`` by
  their papers' formulas on the weighted updates (``verify.independent.references``); the element-wise, spherical
  and KnOTS merges by ``verify.independent.merges`` (random masks re-drawn from the recorded seed); ``refactor``:
  the expression; each times its multiplier. ``per_module`` rows (mergekit's gradients and filters) are read
  module by module (``module_recipe``); a ``lora_bias`` input's bias by the same linear map as its weights
  (``BIASED`` methods).

Inner products come from Grams (``<X, Y> = sum((B_x^T B_y) * (A_x A_y^T))``), norms too where nothing cancels
(``Stack.norm``: the Gram's error bounded against the terms' norms) and from R factors (``||R_b R_a^T||``) where
a difference nearly cancels. The written update W is then compared with I (``independent.independent``; ``rank:
keep-base`` is lossless, compared directly). What this path does not cover (DoRA or expert inputs, lora_bias
inputs of a non-linear recipe, per-module values of a step) raises ``Uncovered`` with the reason; that update is
still checked by re-evaluating the recipe (``verify.checks.update``), which is not independent of the pipeline.
"""

from __future__ import annotations

import math
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from .expressions import coefficients
from .lora_terms import LoraFolder, read_folder, uncovered
from .merges import COVERED, merged
from .references import SPECTRAL, Uncovered, shared_cores, spectral
from .stack import ZERO_RTOL, Stack

STEPPED = ("add", "onto-ref", "orthogonal")
BIASED = ("add", "expression", "linear", "svd", "cat", "task_arithmetic")  # lora_bias: a fixed linear map
LINEAR_MERGES = ("linear", "svd", "cat", "task_arithmetic", "slerp")
SLERP_DOT = 0.9995    # mergekit's colinearity threshold on |cos theta|
DIVISOR_EPS = 1e-8    # normalize by sum(weights) only when it is not ~0 (mergekit's rule)


@dataclass
class Derivation:
    """What an output should hold, by verify's own path.

    Args:
        kind (str): project | merge | refactor. names (list[str]): the modules the output should hold.
        rank (str): the recipe's rank policy. alpha (float | None): the global ``k * alpha`` (None: per module).
        module_alpha (dict[str, float]): ``k * alpha_m`` per module (stepped recipes).
        dropped, zeroed (list[str]): modules the consensus drops, modules the mode gives no step.
        realized (float | None): ``||step|| / ||base||``.
        problems (list[str]): what makes the recipe refuse (a consensus that fails, min_agree).
    """

    kind: str
    names: list
    rank: str
    folders: dict
    forms: dict = field(default_factory=dict)
    alpha: float | None = None
    module_alpha: dict = field(default_factory=dict)
    coeff: dict = field(default_factory=dict)
    dropped: list = field(default_factory=list)
    zeroed: list = field(default_factory=list)
    realized: float | None = None
    problems: list = field(default_factory=list)
    allow_missing: bool = False
    slerp: dict | None = None
    spectral: dict | None = None
    merge: dict | None = None                       # a non-linear merge: method, recipe, weights, densities
    recipe: dict = field(default_factory=dict)      # a merge's recipe with per_module rows (read module by module)
    dir_norms: dict = field(default_factory=dict)   # ||dir'_m|| (project): ||step_m|| = |k alpha_m| ||dir'_m||
    protect: dict = field(default_factory=dict)     # a protected step: module -> U (in, c), dir' -> dir' (I - U U^T)

    def _slerp_weights(self, xs: dict) -> dict:
        """SLERP's (c0, c1): recorded over all modules (global scope) or from module m's two updates."""
        a, b = xs.values()
        sl = self.slerp or {}
        c = sl.get("c") or slerp_weights(a.norm(), b.norm(), a.inner(b), sl["t"])
        return dict(zip(xs, c))

    def close(self) -> None:
        for f in self.folders.values():
            f.close()

    def operand(self, which: str, m: str) -> Stack:
        """Module m of the expression ``which`` (base, dir, ref, or a merge's ``models[i]``)."""
        out = None
        for n, c in self.forms[which].items():
            f: LoraFolder = self.folders[n]
            if m not in f.keys:
                if not self.allow_missing:
                    raise Uncovered(f"module {m} is missing from input {n}")
                continue
            B, A = f.factors(m)
            term = Stack(B * c, A, abs(c) * float(np.linalg.norm(B)) * float(np.linalg.norm(A)))
            out = term if out is None else out + term
        if out is None:
            shape = next(self.folders[n].factors(m) for n in self.folders if m in self.folders[n].keys)
            return Stack.zero(shape[0].shape[0], shape[1].shape[1])
        return out

    def operand_bias(self, which: str, m: str) -> np.ndarray | None:
        """Module m's bias update of the expression ``which`` (lora_bias inputs), None where no input has one."""
        out = None
        for n, c in self.forms[which].items():
            f: LoraFolder = self.folders[n]
            v = f.bias(m) if m in f.bias_keys else None
            if v is not None:
                out = c * v if out is None else out + c * v
        return out

    def intended_bias(self, m: str) -> np.ndarray | None:
        """Module m's intended bias update (BIASED methods: the same linear map as the weights'), or None:
        ``b_m = base_m + k alpha_m mult_m dir_m`` (add), ``mult_m sum_i w_i operand_i`` (merge, refactor)."""
        if self.kind == "project":
            b, d = self.operand_bias("base", m), self.operand_bias("dir", m)
            c = self.coeff.get(m)
            if d is None or c is None:
                return b
            step = self.module_alpha[m] * c[0] * d
            return step if b is None else b + step
        out = None
        for which, w in self.forms["_weights"].items():
            v = self.operand_bias(which, m)
            if v is not None:
                v = v * (w * self.coeff.get(m, 1.0))
                out = v if out is None else out + v
        return out

    def stepped_dir(self, m: str, base: Stack, d: Stack, c=None, protected: bool = True) -> Stack:
        """``dir'_m``: the mode's direction times the multiplier (zero if dropped or not selected), projected
        ``A - (A U) U^T`` when the step is protected (``protected=False``: before that projection)."""
        c = self.coeff.get(m) if c is None else c
        if c is None:
            return d.scaled(0.0)
        if c[2] is not None:
            out = self.operand("ref", m).scaled(c[2])
        else:
            out = d.scaled(c[0]) + base.scaled(c[1]) if c[1] != 0.0 else d.scaled(c[0])
        U = self.protect.get(m) if protected else None
        return out if U is None else Stack(out.B, out.A - (out.A @ U) @ U.T, out.bound)

    def intended(self, m: str) -> tuple[Stack, Stack | None, Stack | None]:
        """``(I_m, base_m, step_m)``: the update module m should hold, and for a step its backbone and step."""
        if self.recipe.get("per_module"):  # module m's values over the recipe's (mergekit's gradients, filters)
            local = replace(self, forms=dict(self.forms), recipe={})
            _merge_parts(local, module_recipe(self.recipe, m), self.slerp)
            return local.intended(m)
        if self.merge is not None:  # verify.independent.merges, on the unweighted models
            g = self.merge
            models = [self.operand(w, m) for w in self.forms["_weights"]]
            out = merged(g["method"], m, models, g["weights"], g["densities"], g["recipe"])
            return out.scaled(self.coeff.get(m, 1.0)), None, None
        if self.kind != "project" and self.spectral is not None:
            ws = [self.operand(w, m).scaled(c) for w, c in self.forms["_weights"].items()]
            Qb, cores, Qa = shared_cores([(x.B, x.A) for x in ws])
            core = spectral(self.spectral["method"], cores, (ws[0].B.shape[0], ws[0].A.shape[1]), self.spectral)
            return Stack(Qb @ core * self.coeff.get(m, 1.0), Qa.T), None, None
        if self.kind != "project":
            xs = {which: self.operand(which, m) for which in self.forms["_weights"]}
            weights = self.forms["_weights"] if self.slerp is None else self._slerp_weights(xs)
            first = next(iter(xs.values()))
            total = Stack.zero(first.B.shape[0], first.A.shape[1])
            for which, w in weights.items():
                total = total + xs[which].scaled(w * self.coeff.get(m, 1.0))
            return total, None, None
        base = self.operand("base", m)
        step = self.stepped_dir(m, base, self.operand("dir", m)).scaled(self.module_alpha[m])
        return base + step, base, step


def slerp_weights(n0: float, n1: float, inner: float, t: float) -> tuple[float, float]:
    """mergekit's SLERP on unnormalized updates: ``sin((1-t) theta) / sin theta``, ``sin(t theta) / sin theta`` with
    ``cos theta = inner / (n0 n1)``; ``(1 - t, t)`` when a norm is zero or ``|cos theta| > SLERP_DOT``."""
    if n0 == 0.0 or n1 == 0.0:
        return 1.0 - t, t
    cos = inner / (n0 * n1)
    if abs(cos) > SLERP_DOT:
        return 1.0 - t, t
    theta = math.acos(max(-1.0, min(1.0, cos)))
    return math.sin((1.0 - t) * theta) / math.sin(theta), math.sin(t * theta) / math.sin(theta)


def _multiplier(recipe: dict, m: str) -> float:
    for pat, v in (recipe.get("multipliers") or {}).items():
        if re.search(pat, m):
            return float(v)
    return 1.0


def _selected(recipe: dict, m: str) -> bool:
    only, excl = recipe.get("only"), recipe.get("exclude")
    return (only is None or re.search(only, m) is not None) and not (excl is not None and re.search(excl, m))


def derive(manifest: dict, protector=None) -> Derivation:
    """The Derivation of an output from its manifest (inputs at absolute paths); Uncovered when out of reach.

    ``protector(d)`` (a protected step, ``protected``) returns ``{module: U}`` once the forms are read and
    before alpha is chosen; without one a protected recipe is Uncovered."""
    r = manifest["recipe"]
    method = r.get("method")
    kind = "project" if method in STEPPED else "refactor" if method == "expression" else "merge"
    if kind == "merge" and method not in LINEAR_MERGES + SPECTRAL + COVERED:
        raise Uncovered(f"method {method}: no independent reference yet")
    if r.get("protect") and protector is None:
        raise Uncovered("a protected step needs the base model to re-derive; pass --base-model")
    if r.get("base_model") is not None and not r.get("protect"):  # a protected step's base model reads inputs
        raise Uncovered("a DoRA base model")
    if r.get("per_module") and kind != "merge":
        raise Uncovered("per-module values (per_module) of a project or refactor recipe")
    paths = {n: e["path"] for n, e in (r.get("inputs") or {}).items()}
    for p in paths.values():
        why = uncovered(p)
        if why:
            raise Uncovered(why)
    folders = {n: read_folder(p) for n, p in paths.items()}
    if any(f.bias_keys for f in folders.values()) and (method not in BIASED or r.get("protect")
                                                        or r.get("per_module")):
        for f in folders.values():
            f.close()
        raise Uncovered(f"lora_bias inputs with method {method} (a bias is re-derived for {', '.join(BIASED)})")
    pins = {n: e.get("sha256") for n, e in (r.get("inputs") or {}).items()}
    changed = [n for n, f in folders.items() if f.sha256 != pins.get(n)]
    d = Derivation(kind, [], str(r.get("rank", "exact")), folders, allow_missing=bool(r.get("allow_missing")))
    d.problems += [f"input {n}: its weights hash to {folders[n].sha256[:16]}..., not the pinned "
                   f"{str(pins.get(n))[:16]}..." for n in changed]
    try:
        _fill(d, r, method, kind, protector)
    except BaseException:
        d.close()
        raise
    return d


def _fill(d: Derivation, r: dict, method: str, kind: str, protector=None) -> None:
    """The forms, modules and coefficients of ``d`` from the recipe ``r`` (see ``derive``)."""
    if kind == "project":
        d.forms = {k: coefficients(r[k]) for k in ("base", "dir")}
        if r.get("consensus") or method == "onto-ref":
            d.forms["ref"] = coefficients((r.get("consensus") or {})["ref"])
        order = dict.fromkeys(n for form in d.forms.values() for n in form)  # the inputs in first use
        d.names = list(dict.fromkeys(m for n in order for m in d.folders[n].keys))  # a module some input lacks
        if protector is not None:
            d.protect = protector(d)
        _step(d, r, method)
        return
    exprs = [r["base"]] if kind == "refactor" else [e["model"] for e in r["models"]]
    d.forms = {f"models[{i}]": coefficients(x) for i, x in enumerate(exprs)}
    _merge_parts(d, r, None)
    seen = dict.fromkeys(m for w in d.forms["_weights"] for n in d.forms[w] for m in d.folders[n].keys)
    d.names = [m for m in seen if _selected(r, m)]
    d.coeff = {m: _multiplier(r, m) for m in d.names}
    if r.get("per_module"):
        if method == "slerp" and r.get("slerp_scope") == "global" and "t" in r["per_module"]:
            raise Uncovered("a per-module t with slerp_scope global (the pipeline's one angle takes the recipe's t)")
        d.recipe = r
    if method == "slerp" and r.get("slerp_scope") == "global":  # one angle from the whole adapters
        n0 = n1 = inner = 0.0
        for m in d.names:
            a, b = d.operand("models[0]", m), d.operand("models[1]", m)
            n0, n1, inner = n0 + a.norm() ** 2, n1 + b.norm() ** 2, inner + a.inner(b)
        d.slerp = {"t": float(r["t"]), "c": slerp_weights(math.sqrt(n0), math.sqrt(n1), inner, float(r["t"]))}


def module_recipe(r: dict, m: str) -> dict:
    """The recipe as module m reads it: each ``per_module`` row's value for the first pattern m matches
    (``re.search``) over the recipe's field, or over model i's field for a key ``models.I.FIELD``."""
    out = {**r, "models": [dict(e) for e in r.get("models") or []]}
    for key, rows in (r.get("per_module") or {}).items():
        for pattern, value in rows:
            if re.search(pattern, m):
                if key.startswith("models."):
                    _, i, name = key.split(".", 2)
                    out["models"][int(i)][name] = value
                else:
                    out[key] = value
                break
    return out


def _merge_parts(d: Derivation, r: dict, slerp: dict | None) -> None:
    """A merge's weights (``forms["_weights"]``, with task arithmetic's lambda), its non-linear method, spectral
    parameters or slerp t from the recipe ``r`` (one module's under ``per_module``; ``slerp``: a global angle)."""
    method, kind = r.get("method"), d.kind
    weights = [1.0] if kind == "refactor" else [float(e.get("weight", 1.0)) for e in r["models"]]
    lam = 1.0
    if method == "task_arithmetic":  # mergekit's lambda (a recipe key), over sum(w) with normalize
        lam = 1.0 if r.get("lambda") is None else float(r["lambda"])
        if r.get("normalize") and abs(sum(weights)) >= DIVISOR_EPS:
            lam /= sum(weights)
    d.forms["_weights"] = {f"models[{i}]": w * lam for i, w in enumerate(weights)}
    if method in COVERED:  # verify.independent.merges: weights and densities per model, the recipe's fields
        d.merge = {"method": method, "recipe": r, "weights": weights,
                   "densities": [float(e["density"]) if e.get("density") is not None else float(r.get("density") or 1.0)
                                 for e in r["models"]]}
    if method in SPECTRAL:  # the papers' definitions on the models' weighted cores (verify.independent.references)
        d.spectral = {k: r.get(k) for k in ("lambda", "sv_reduction", "common_space_fraction", "svc_alpha")
                      if r.get(k) is not None}
        d.spectral["method"] = method
    if method == "slerp":
        d.slerp = slerp if slerp is not None and "c" in slerp else {"t": float(r["t"])}


def _module_step(d: Derivation, r: dict, method: str, m: str) -> dict:
    """Module m's part of the step's pass: its norms, its consensus sign and the mode's coefficients."""
    with np.errstate(over="raise", invalid="raise", divide="raise"):  # per thread: errstate is thread-local
        base = d.operand("base", m)
        out: dict[str, Any] = {"bn": base.norm(), "dn": 0.0}
        if not _selected(r, m):  # only/exclude: no step, and no say in the consensus
            return out
        direction = d.operand("dir", m)
        nd = direction.norm()
        dir_zero = nd <= ZERO_RTOL * direction.bound
        ref = d.operand("ref", m) if "ref" in d.forms else None
        nr = ref.norm() if ref is not None else 0.0
        if ref is not None and (r.get("consensus") or {}).get("ref") and not (nr <= ZERO_RTOL * ref.bound
                                                                               or dir_zero):
            out["sign"] = -1 if ref.inner(direction) < 0 else 1
        k = _multiplier(r, m)
        if method == "add":
            out.update(c=(k, 0.0, None), dn=abs(k) * nd)
        elif method == "orthogonal":
            nb = out["bn"]
            a = direction.inner(base) / (nb * nb) if nb else 0.0
            dn = (direction + base.scaled(-a)).norm() if a != 0.0 else nd  # by QR: nothing cancels
            out.update(c=(k, -a * k, None), dn=abs(k) * dn)
        else:
            a = direction.inner(ref) / (nr * nr) if nr and ref is not None else 0.0
            c = max(a, 0.0) * k
            out.update(c=(0.0, 0.0, c), dn=abs(c) * nr, zeroed=a <= 0 and not dir_zero and k != 0)
        if m in d.protect and "c" in out:  # the projected direction's own norm
            out["dn"] = d.stepped_dir(m, base, direction, out["c"]).norm()
        return out


def _step(d: Derivation, r: dict, method: str, threads: int = 2) -> None:
    """The consensus, the mode's coefficients and alpha of a project recipe: one pass over the modules on
    worker threads (each operand read once, each norm taken once), summed in module order."""
    with ThreadPoolExecutor(max(1, threads)) as pool:
        rows = dict(zip(d.names, pool.map(lambda m: _module_step(d, r, method, m), d.names)))
    bn = {m: x["bn"] for m, x in rows.items()}
    dn = {m: x["dn"] for m, x in rows.items()}
    d.coeff = {m: x["c"] for m, x in rows.items() if "c" in x}
    d.zeroed = [m for m, x in rows.items() if x.get("zeroed")]
    cons = r.get("consensus") or {}
    if cons.get("ref"):
        signs = {m: x["sign"] for m, x in rows.items() if "sign" in x}
        bad = [m for m, v in signs.items() if v < 0]
        agree, signed = len(signs) - len(bad), len(signs)
        share = agree / signed if signed else 0.0
        if cons.get("min_agree") is not None and share < cons["min_agree"]:
            d.problems.append(f"consensus: {agree}/{signed} agree < min_agree {cons['min_agree']}")
        if bad and cons.get("on_disagree", "fail") == "fail":
            d.problems.append(f"consensus: {len(bad)} module(s) disagree and on_disagree is fail")
        if cons.get("on_disagree") == "drop":
            d.dropped = bad
            for m in bad:
                d.coeff.pop(m, None)
                dn[m] = 0.0
    d.dir_norms = dn
    _alpha(d, r, bn, dn)


def _alpha(d: Derivation, r: dict, bn: dict, dn: dict) -> None:
    """alpha by the trust region (``T ||base|| / ||dir'||``, global or per module), ``--alpha`` clipped to it."""
    trust, given, k = r.get("trust"), r.get("alpha"), float(r.get("multiple", 1.0))
    B, D = math.sqrt(sum(v * v for v in bn.values())), math.sqrt(sum(v * v for v in dn.values()))

    def bounded(b: float, n: float) -> float:
        bound = trust * b / n if (trust is not None and n) else (0.0 if trust is not None else math.inf)
        a = bound if given is None else given
        return math.copysign(min(abs(a), bound), a) if trust is not None else a

    if r.get("trust_scope", "global") == "global":
        a = bounded(B, D)
        d.alpha = a * k
        d.module_alpha = {m: a * k for m in d.names}
    else:
        d.module_alpha = {m: bounded(bn[m], dn[m]) * k for m in d.names}
    step = math.sqrt(sum((abs(d.module_alpha[m]) * dn[m]) ** 2 for m in d.names))
    d.realized = step / B if B else None
