"""Everything but the writing: inputs, one basis per module, consensus, the method and the step.

For every module m, the recipe's expressions (``base``, ``dir``, ``ref``) become cores of one shared basis
(``subspace.Subspace``); then, for a stepped method::

    dir'_m = method(dir_m, base_m, ref_m)     (0 for modules the consensus gate drops)
    alpha  = trust-region choice over all modules (``step.choose_step``)
    intended_m = base_m + k * alpha_m * dir'_m   (k: the dose multiple of one output)

and for any other method ``intended_m = mult_m * method(operands_m)`` (a core, or a ``Dense`` matrix for a
dense-space merge). All float64; exact except the dense-space methods' cut. ``only``/``exclude`` select
modules (``project`` gives the others no step); ``multipliers`` scale a merge's update or ``project``'s
direction before alpha is chosen.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

from .. import methods
from ..analysis.consensus import ConsensusResult, agreement_rows, apply_on_disagree, roundoff_floor
from ..analysis.step import StepSize, choose_step
from ..errors import Problem, RecipeError, few
from ..expr import LinearForm, parse
from ..linalg.dense import Dense
from ..linalg.lowrank import LowRank, check_magnitude, combine
from ..linalg.subspace import Apart, InSpan, Subspace
from ..linalg.threads import Progress, map_modules
from ..methods.base import Method, ModuleOperands
from ..peft.adapter import Adapter
from ..recipe.recipe import Recipe
from ..workspace.names import Workspace
from ..workspace.taskvector import TaskVector
from .inputs import open_inputs

BASES_BUDGET = 1 << 30  # bytes of float64 bases kept across modules (see evaluate)


@dataclass(frozen=True)
class Evaluation:
    """A recipe evaluated over its inputs, ready to be cut and written (or verified).

    Args:
        recipe (Recipe): what was asked. method (Method): the registered method that computes it.
        inputs (dict[str, InputRecord]): every input adapter, hashed.
        names (tuple[str]): the modules, in order. specs (dict[str, ModuleSpec]): their layouts.
        operands (dict[str, TaskVector]): ``base``/``dir``/``ref`` as cores (InSpan) per module; a
            consensus reference the method does not read is kept out of the basis (``Apart``: its norm and
            its inner product with ``dir``, all the gate reads).
        vectors (dict[str, TaskVector]): each input's own factors (LowRank), as read.
        missing (dict[str, list[str]]): input name -> modules it lacks (treated as zero).
        template (Adapter): the first base input (its config is the output's template).
        consensus (ConsensusResult | None): the gate's verdict, when the recipe has one.
        direction (TaskVector | None): ``dir'`` after the mask and the method (stepped methods).
        step (StepSize | None): the chosen alpha (stepped methods).
        zeroed (tuple[str]): modules the method gave no step although their direction is non-zero.
        params (dict | None): what the method's ``prepare`` made of the recipe's fields (None: as given).
        unselected (tuple[str]): ``project``: modules outside ``only``/``exclude`` (no step); a merge
            evaluates the selected ones only, ``excluded`` lists the others.
        excluded (tuple[str]): modules of the inputs left out by ``only``/``exclude``.
        multipliers (dict[str, float]): per module, the first matching pattern's factor (matched modules only).
        protection (dict | None): a protected step's figures (``pipeline/protection.py``); the direction is D'.
    """

    recipe: Recipe
    method: Method
    inputs: dict
    names: tuple
    specs: dict
    operands: dict
    vectors: dict
    missing: dict
    template: Adapter
    consensus: ConsensusResult | None = None
    direction: TaskVector | None = None
    step: StepSize | None = None
    zeroed: tuple = ()
    params: dict | None = None
    unselected: tuple = ()
    excluded: tuple = ()
    multipliers: dict = field(default_factory=dict)
    protection: dict | None = None

    @property
    def dropped(self) -> tuple:
        """Modules the consensus gate zeroed in the direction (``on_disagree: drop``)."""
        return self.consensus.dropped if self.consensus else ()

    @property
    def base_name(self) -> str:
        """The first adapter of the base expression, or of a merge's first model (the output's template)."""
        if self.recipe.base is not None:
            return parse(self.recipe.base).names()[0]
        return parse((self.recipe.models or [])[0]["model"]).names()[0]

    @property
    def model_keys(self) -> list[str]:
        """The operand keys of a merge's models, in order (empty for other methods)."""
        return [model_key(i) for i in range(len(self.recipe.models or []))] if "models" in self.method.operands \
            else []

    def selection(self) -> dict | None:
        """What ``only``/``exclude`` selected (None when the recipe selects nothing)."""
        r = self.recipe
        if r.only is None and r.exclude is None:
            return None
        left_out = self.excluded or self.unselected
        return {"only": r.only, "exclude": r.exclude, "selected": len(self.names) - len(self.unselected),
                "of": len(self.names) + len(self.excluded), "left_out": list(left_out),
                "left_out_means": "no step (the backbone as it is)" if self.unselected else "not written"}


def model_key(i: int) -> str:
    """The operand key of a merge's i-th model (``models[i]``)."""
    return f"models[{i}]"


def operand_forms(recipe: Recipe, method: Method) -> dict[str, LinearForm]:
    """``{operand: LinearForm}`` for the expressions the method reads (and the consensus reference)."""
    if "models" in method.operands:
        return {model_key(i): parse(e["model"]) for i, e in enumerate(recipe.models or [])}
    exprs = {"base": recipe.base, "dir": recipe.dir, "ref": recipe.consensus.ref if recipe.consensus else None}
    wanted = [k for k in exprs if k in method.operands or (k == "ref" and recipe.consensus)]
    return {k: parse(e) for k in wanted if (e := exprs[k]) is not None}


def select(recipe: Recipe, names: list[str]) -> tuple[list[str], tuple, dict]:
    """``(selected, left out, {module: multiplier})`` by the recipe's ``only``, ``exclude`` and ``multipliers``.

    A module is selected when ``re.search(only, m)`` (or no ``only``) and not ``re.search(exclude, m)``;
    its multiplier is that of the first pattern of ``multipliers`` it matches. RecipeError when nothing
    is selected, or a multiplier pattern applies to no selected module (a typo, or shadowed by an
    earlier pattern).

    Args:
        recipe (Recipe): its ``only``, ``exclude``, ``multipliers``. names (list[str]): the modules, in order.
    """
    only = re.compile(recipe.only) if recipe.only is not None else None
    excl = re.compile(recipe.exclude) if recipe.exclude is not None else None
    selected = [m for m in names if (only is None or only.search(m)) and not (excl and excl.search(m))]
    if not selected:
        given = [(k, repr(v)) for k, v in (("only", recipe.only), ("exclude", recipe.exclude)) if v]
        raise RecipeError([Problem(" and ".join("{" + k + "=}{}" for k, _ in given) + ": selects none of the {} "
                                   "modules ({})", *(v for _, v in given), len(names), few(names, 3))])
    mult, used = {}, set()
    pats = [(re.compile(k), k, v) for k, v in (recipe.multipliers or {}).items()]
    for m in selected:
        for rx, k, v in pats:
            if rx.search(m):
                mult[m] = v
                used.add(k)
                break
    unused = [k for _, k, _ in pats if k not in used]
    if unused:
        raise RecipeError([Problem("{multipliers}.{}: applies to none of the {} selected modules (no match, or an "
                                   "earlier pattern matches first)", k, len(selected)) for k in unused])
    keep = set(selected)
    return selected, tuple(m for m in names if m not in keep), mult


def evaluate(recipe: Recipe, ws: Workspace, progress: Progress | None = None) -> Evaluation:
    """Inputs, the shared basis and cores per module, the consensus gate, the method and the step.

    ``evaluate_cores`` then ``complete``.

    Args:
        recipe (Recipe): the validated recipe. ws (Workspace): name resolution and the device.
        progress: optional callable wrapping the module iterable (a tqdm bar).

    Returns:
        Evaluation; raises CheckFailed (exit 1) when the consensus gate fails.
    """
    return complete(evaluate_cores(recipe, ws, progress))


def evaluate_cores(recipe: Recipe, ws: Workspace, progress: Progress | None = None) -> Evaluation:
    """Inputs, the selection and the operands as cores of one shared basis per module: no consensus
    decision, no step yet.

    Args:
        recipe (Recipe): the validated recipe. ws (Workspace): name resolution and the device.
        progress: optional callable wrapping the module iterable (a tqdm bar).
    """
    method = methods.get(recipe.method)
    forms = operand_forms(recipe, method)
    order = list(dict.fromkeys(n for form in forms.values() for n in form.names()))
    ws, inputs, opened = open_inputs(recipe, ws, order)
    vecs, names = opened.vectors, opened.align(allow_missing=recipe.allow_missing)[1]
    selected, left_out, mult = select(recipe, names)
    if not method.stepped:
        names = selected  # a merge (or refactor) writes the selected modules only
    missing = opened.missing(names)
    specs = {m: next(v.specs[m] for v in vecs.values() if m in v.specs) for m in names}

    # A stepped method that does not read the consensus reference keeps it out of the basis (``Apart``):
    # the basis spans the base and the direction only (the v58 step: p = 3r, not 4r).
    apart = {"ref"} if method.stepped and "ref" in forms and "dir" in forms and "ref" not in method.operands \
        else set()
    spanned = {n for k, form in forms.items() if k not in apart for n in form.names()}

    # Keep every module's bases when they fit in BASES_BUDGET (saves forming them twice); else
    # hold only the small cores and form one module's bases at a time when writing.
    widths = {m: sum(v.modules[m].rank for n, v in vecs.items() if n in spanned and m in v.modules) for m in names}
    keep = sum(8 * w * sum(specs[m].shape) for m, w in widths.items()) <= BASES_BUDGET

    def module_cores(m: str) -> dict[str, InSpan | Apart]:
        terms = {n: v.modules[m] for n, v in vecs.items() if m in v.modules and n in spanned}
        space, own = Subspace.of(list(terms.values()), specs[m].shape, keep_bases=keep, device=ws.device)
        proj = dict(zip(terms, own))
        out: dict[str, InSpan] = {}
        for k, form in forms.items():
            if k in apart:
                continue
            x = space.zero()
            for n in form.names():
                if n in proj and form.coeffs[n] != 0.0:
                    x = x + proj[n] * form.coeffs[n]
            scales = max((abs(t.scale) for n, t in terms.items() if n in form.coeffs), default=0.0)
            check_magnitude(m, f"{k} ({form})", x.C, "keep the expression's coefficients and the inputs' scales "
                            f"(lora_alpha / r, here up to {scales:.3g}) in a sane range")
            out[k] = x
        return {**out, **{k: apart_operand(m, k, forms[k], forms["dir"], vecs, specs[m].shape, out["dir"])
                          for k in apart}}

    per = map_modules(module_cores, names, progress)
    operands = {k: TaskVector({m: per[m][k] for m in names}, specs) for k in forms}
    return Evaluation(recipe, method, inputs, tuple(names), specs, operands, vecs,
                      {k: v for k, v in missing.items() if v}, ws.adapter(order[0], recipe.modules_to_save),
                      unselected=() if not method.stepped else left_out,
                      excluded=left_out if not method.stepped else (), multipliers=mult)


def apart_operand(m: str, k: str, form: LinearForm, dir_form: LinearForm, vecs: dict, shape: tuple, d: InSpan
                  ) -> Apart:
    """Operand ``k`` of module m outside its basis (``Apart``): its norm by its own R-only QR, its inner
    product with the direction ``d`` in Gram form over both expressions' factors as read.

    Args:
        m (str): the module. k (str): the operand. form, dir_form (LinearForm): its expression and the direction's.
        vecs (dict[str, TaskVector]): the inputs. shape (tuple): (out, in). d (InSpan): the direction's core.
    """
    def factors(f: LinearForm) -> LowRank:
        live = [(c, vecs[n].modules[m]) for n, c in f.coeffs.items() if c != 0.0 and m in vecs[n].modules]
        return combine(live) if live else LowRank.zeros(shape, d.space.device)

    x = factors(form)
    scales = max((abs(vecs[n].modules[m].scale) for n in form.coeffs if m in vecs[n].modules), default=0.0)
    fix = ("keep the expression's coefficients and the inputs' scales "
           f"(lora_alpha / r, here up to {scales:.3g}) in a sane range")
    check_magnitude(m, f"{k} ({form})", x, fix)
    norm = x.norm()
    check_magnitude(m, f"{k} ({form})", norm, fix)
    return Apart(shape, norm, roundoff_floor(x), d, x.inner(factors(dir_form)) if x.rank else 0.0)


def consensus_rows(ev: Evaluation) -> list[dict] | None:
    """``consensus.agreement_rows`` of the reference against the direction over the selected modules (None
    without a reference): what the consensus gate decides on, and what ``vecmerge gate`` counts."""
    if "ref" not in ev.operands or "dir" not in ev.operands:
        return None
    left_out = set(ev.unselected)
    gated = [m for m in ev.names if m not in left_out]
    return agreement_rows(ev.operands["ref"], ev.operands["dir"], gated)


def complete(ev: Evaluation, rows: list[dict] | None = None) -> Evaluation:
    """The consensus decision, the method and the step on evaluated cores (a merge: the method's ``prepare``).

    Args:
        ev (Evaluation): from ``evaluate_cores``. rows (list[dict] | None): ``consensus_rows(ev)`` when the
            caller has them already.

    Returns:
        Evaluation; raises CheckFailed (exit 1) when the consensus gate fails.
    """
    recipe, method, operands, names, mult = ev.recipe, ev.method, ev.operands, ev.names, ev.multipliers
    if not method.stepped:
        params = method.prepare({m: module_operands(ev, m) for m in names}, recipe.params)
        return replace(ev, params=params)
    consensus = None
    sel = set(names) - set(ev.unselected)
    if recipe.consensus:
        c = recipe.consensus
        consensus = apply_on_disagree(c.ref, rows if rows is not None else consensus_rows(ev) or [], c.on_disagree,
                                      c.min_agree)  # a consensus recipe has its reference: rows are never None
    drop = set(consensus.dropped if consensus else ())
    params = recipe.params

    def shaped(m: str, d: InSpan) -> InSpan:
        if m in drop or m not in sel:
            return d * 0.0
        ref = operands["ref"][m] if "ref" in method.operands else None  # else not read (and maybe Apart)
        out = method.module(ModuleOperands(m, operands["base"][m], d, ref), params)
        return out * mult[m] if mult.get(m, 1.0) != 1.0 else out

    direction = operands["dir"].map(shaped)
    zeroed = tuple(m for m in names if m not in drop and m in sel and mult.get(m, 1.0) != 0.0
                   and direction[m].norm() == 0.0 and operands["dir"][m].norm() > 0)
    step = choose_step(operands["base"], direction, trust=recipe.trust, alpha=recipe.alpha, scope=recipe.trust_scope)
    return replace(ev, consensus=consensus, direction=direction, step=step, zeroed=zeroed)


def module_operands(ev: Evaluation, m: str) -> ModuleOperands:
    """Module m's operands for the method: base (refactor), or a merge's models with weights, densities, terms.

    Args:
        ev (Evaluation): the evaluated recipe. m (str): a module.
    """
    x = ev.operands
    keys = ev.model_keys
    if not keys:
        return ModuleOperands(m, x["base"][m] if "base" in x else None, None, None)
    entries = ev.recipe.models or []  # a merge (it has keys) has models
    terms = []
    for e in entries:
        form = parse(e["model"])
        terms.append(tuple((c, ev.vectors[n].modules[m]) for n, c in form.coeffs.items()
                           if c != 0.0 and m in ev.vectors[n].modules))
    rows = ev.recipe.per_module or {}
    weights = tuple(per_module(rows, f"models.{i}.weight", m, e["weight"]) for i, e in enumerate(entries))
    densities = tuple(per_module(rows, f"models.{i}.density", m, e.get("density")) for i, e in enumerate(entries))
    return ModuleOperands(m, models=tuple(x[k][m] for k in keys), weights=weights, densities=densities,
                          terms=tuple(terms))


def per_module(rows: dict, key: str, m: str, default: float | None) -> float | None:
    """Module m's value of ``key`` in a recipe's ``per_module`` rows: the first pattern m matches, else ``default``.

    Args:
        rows (dict): ``{key: [[pattern, value], ...]}``. key (str): a field or ``models.I.weight``. m (str): a module.
    """
    for pattern, value in rows.get(key, ()):
        if re.search(pattern, m):
            return value
    return default


def method_params(ev: Evaluation, m: str | None = None) -> dict:
    """The parameters the method's ``module`` receives (``prepare``'s, else the recipe's fields), with module m's
    ``per_module`` values over them."""
    params = ev.params if ev.params is not None else ev.recipe.params
    rows = {k: v for k, v in (ev.recipe.per_module or {}).items() if not k.startswith("models.")}
    if m is None or not rows:
        return params
    return {**params, **{k: per_module(rows, k, m, params.get(k)) for k in rows}}


def intended_core(ev: Evaluation, m: str, multiple: float) -> tuple[InSpan | Dense | LowRank, InSpan | None]:
    """``(intended_m, step_m)``: ``base_m + multiple * alpha_m * dir'_m`` and the step (None without one).

    Without a step, the method's update times the module's multiplier: a core (InSpan), a ``Dense``
    matrix for a dense-space merge (formed here, one module at a time), or factors (``LowRank``) for a
    merge whose result lies outside the module's basis.

    Both are checked to lie in float64's safe range (``lowrank.check_magnitude``: NumericError otherwise).

    Args:
        ev (Evaluation): the evaluated recipe. m (str): a module. multiple (float): the output's dose.
    """
    step, direction = ev.step, ev.direction  # ``complete`` sets both (a stepped method) or neither
    if step is None or direction is None:
        target = ev.method.module(module_operands(ev, m), method_params(ev, m))
        k = ev.multipliers.get(m, 1.0)
        target = target * k if k != 1.0 else target
        values = target.C if isinstance(target, InSpan) else target.D if hasattr(target, "D") else target.B
        check_magnitude(m, "the intended update", values, "use smaller coefficients")
        if isinstance(target, LowRank):
            check_magnitude(m, "the intended update", target.A, "use smaller coefficients")
        return target, None
    step_m = direction[m] * (step.module_alpha[m] * multiple)
    check_magnitude(m, "the step (alpha * dir)", step_m.C, "use an --alpha (or --trust) of a sane size")
    target = ev.operands["base"][m] + step_m
    check_magnitude(m, "the intended update", target.C, "use a smaller --alpha (or --trust)")
    return target, step_m


def intended(ev: Evaluation, m: str, multiple: float) -> tuple[LowRank | Dense, LowRank | None]:
    """``intended_core`` as factors (rank p: the module's basis) for checks that want a LowRank; a
    dense-space merge's update stays ``Dense``."""
    target, step_m = intended_core(ev, m, multiple)
    if not isinstance(target, InSpan):
        return target, None
    return target.lowrank(), None if step_m is None else step_m.lowrank()
