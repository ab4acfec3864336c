"""The intended update re-derived from the manifest by verify's own float64 path: numpy, no pipeline code.

A bug in the pipeline (the evaluation, a method, the step, a rank cut, the writer) must not be a bug in the
check: this module recomputes what an output should hold from the recorded recipe and its sha256-pinned inputs
(``lora_terms``) with its own arithmetic, every operand of module m a factor stack ``[c_1 s_1 B_1, ...] [A_1; ..]``
(``stack.Stack``; expressions read by Python's ``ast``). ``project``: ``I_m = base_m + k alpha_m dir'_m``
(``step``); ``linear``, ``svd``, ``cat``: ``sum_i w_i x_i``; ``task_arithmetic``: lambda times it (over
``sum w`` with ``normalize``); ``slerp``: mergekit's ``c0 x0 + c1 x1`` (``slerp_weights``, per module or
global); the spectral merges by ``references``; the element-wise, spherical and KnOTS merges by ``merges``;
``refactor``: the expression; each times its multiplier. ``per_module`` rows are read module by module
(``module_recipe``), a ``lora_bias`` input's bias by its weights' linear map (``BIASED``), a DoRA input as its
effective update on the recipe's base model. ``independent`` compares the written W with I. What is not covered
(expert inputs, lora_bias inputs of a non-linear recipe, per-module values of a step) raises ``Uncovered`` with
the reason; that update is still checked by re-evaluating the recipe (``verify.checks.update``), not independent.
"""

from __future__ import annotations

import math
import re
import threading
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ...io.model_folder import ModelFolder
from .expressions import coefficients
from .lora_terms import LoraFolder, base_weight, dora_update, read_folder, uncovered
from .merges import COVERED, merged
from .references import SPECTRAL, Uncovered, shared_cores, spectral
from .stack import Stack
from .step import fill_step, multiplier, selected

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
    base_model: Any = None                          # DoRA inputs: the base model's folder (ModelFolder), its lock
    base_lock: Any = field(default_factory=threading.Lock)
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
        if self.base_model is not None:
            self.base_model.close()

    def _factors(self, f: LoraFolder, m: str) -> tuple[np.ndarray, np.ndarray]:
        """``(B, A)`` of module m of input f: its scaled factors, or a DoRA module's effective update as dense
        factors (``lora_terms.dora_update`` on the base model's weight)."""
        B, A = f.factors(m)
        if m not in f.magnitude_keys:
            return B, A
        if self.base_model is None:
            raise Uncovered(f"{f.path.name}: a DoRA adapter needs its base model (the recipe's base_model)")
        name = f"{m}.weight"
        if name not in self.base_model.tensors:
            raise Uncovered(f"the base model has no tensor {name} for DoRA module {m}")
        with self.base_lock:
            W = base_weight(self.base_model, name)
        D = dora_update(W, B, A, f.magnitude(m))
        return (D, np.eye(D.shape[1])) if D.shape[1] <= D.shape[0] else (np.eye(D.shape[0]), D)

    def operand(self, which: str, m: str) -> Stack:
        """Module m of the expression ``which`` (base, dir, ref, or a merge's ``models[i]``)."""
        out = None
        for n, c in self.forms[which].items():
            f: LoraFolder = self.folders[n]
            if m not in f.keys:
                if not self.allow_missing:
                    raise Uncovered(f"module {m} is missing from input {n}")
                continue
            B, A = self._factors(f, m)
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
    if any(f.magnitude_keys for f in folders.values()):  # DoRA inputs: their effective updates need the base
        if r.get("base_model") is None or r.get("protect"):
            d.close()
            raise Uncovered("DoRA inputs without the recipe's base model (or in a protected step)")
        d.base_model = ModelFolder(r["base_model"])
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
        fill_step(d, r, method)
        return
    exprs = [r["base"]] if kind == "refactor" else [e["model"] for e in r["models"]]
    d.forms = {f"models[{i}]": coefficients(x) for i, x in enumerate(exprs)}
    _merge_parts(d, r, None)
    seen = dict.fromkeys(m for w in d.forms["_weights"] for n in d.forms[w] for m in d.folders[n].keys)
    d.names = [m for m in seen if selected(r, m)]
    d.coeff = {m: multiplier(r, m) for m in d.names}
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
