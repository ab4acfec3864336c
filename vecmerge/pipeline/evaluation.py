"""Everything but the writing: inputs, one basis per module, consensus, the method and the step.

For every module m, the recipe's expressions (``base``, ``dir``, ``ref``) become cores of one shared
basis (``subspace.Subspace``); then, for a stepped method::

    dir'_m = method(dir_m, base_m, ref_m)     (0 for modules the consensus gate drops)
    alpha  = trust-region choice over all modules (``step.choose_step``)
    intended_m = base_m + k * alpha_m * dir'_m   (k: the dose multiple of one output)

and for any other method ``intended_m = method(operands_m)``. All of it exact, factored, float64.
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import methods
from ..adapter import Adapter
from ..consensus import ConsensusResult, agreement_rows, decide
from ..expr import parse
from ..kernels import map_modules
from ..lowrank import LowRank, check_magnitude
from ..methods.base import Method, ModuleOperands
from ..recipe import Recipe
from ..step import StepSize, choose_step
from ..subspace import InSpan, Subspace
from ..taskvector import TaskVector, align
from ..workspace import Workspace
from .inputs import open_inputs

BASES_BUDGET = 1 << 30  # bytes of float64 bases kept across modules (see evaluate)


@dataclass(frozen=True)
class Evaluation:
    """A recipe evaluated over its inputs, ready to be cut and written (or verified).

    Args:
        recipe (Recipe): what was asked. method (Method): the registered method that computes it.
        inputs (dict[str, InputRecord]): every input adapter, hashed.
        names (tuple[str]): the modules, in order. specs (dict[str, ModuleSpec]): their layouts.
        operands (dict[str, TaskVector]): ``base``/``dir``/``ref`` as cores (InSpan) per module.
        vectors (dict[str, TaskVector]): each input's own factors (LowRank), as read.
        missing (dict[str, list[str]]): input name -> modules it lacks (treated as zero).
        template (Adapter): the first base input (its config is the output's template).
        consensus (ConsensusResult | None): the gate's verdict, when the recipe has one.
        direction (TaskVector | None): ``dir'`` after the mask and the method (stepped methods).
        step (StepSize | None): the chosen alpha (stepped methods).
        zeroed (tuple[str]): modules the method gave no step although their direction is non-zero.
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

    @property
    def dropped(self) -> tuple:
        """Modules the consensus gate zeroed in the direction (``on_disagree: drop``)."""
        return self.consensus.dropped if self.consensus else ()

    @property
    def base_name(self) -> str:
        """The first adapter of the base expression (the template, and keep-base's backbone)."""
        return parse(self.recipe.base).names()[0]


def operand_forms(recipe: Recipe, method: Method) -> dict:
    """``{operand: LinearForm}`` for the expressions the method reads (and the consensus reference)."""
    exprs = {"base": recipe.base, "dir": recipe.dir, "ref": recipe.consensus.ref if recipe.consensus else None}
    wanted = [k for k in exprs if k in method.operands or (k == "ref" and recipe.consensus)]
    return {k: parse(exprs[k]) for k in wanted if exprs[k] is not None}


def evaluate(recipe: Recipe, ws: Workspace, progress=None) -> Evaluation:
    """Inputs, the shared basis and cores per module, the consensus gate, the method and the step.

    Args:
        recipe (Recipe): the validated recipe. ws (Workspace): name resolution and the device.
        progress: optional callable wrapping the module iterable (a tqdm bar).

    Returns:
        Evaluation; raises CheckFailed (exit 1) when the consensus gate fails.
    """
    method = methods.get(recipe.method)
    forms = operand_forms(recipe, method)
    order = list(dict.fromkeys(n for form in forms.values() for n in form.names()))
    ws, inputs = open_inputs(recipe, ws, order)
    vecs = {name: ws.vector(name, recipe.modules_to_save) for name in order}
    names = align(list(vecs.values()), list(vecs), recipe.allow_missing)
    missing = {n: [m for m in names if m not in v.modules] for n, v in vecs.items()}
    specs = {m: next(v.specs[m] for v in vecs.values() if m in v.specs) for m in names}

    # Keep every module's bases when they fit in BASES_BUDGET (saves forming them twice); else
    # hold only the small cores and form one module's bases at a time when writing.
    widths = {m: sum(v.modules[m].rank for v in vecs.values() if m in v.modules) for m in names}
    keep = sum(8 * w * sum(specs[m].shape) for m, w in widths.items()) <= BASES_BUDGET

    def module_cores(m: str) -> dict:
        terms = {n: v.modules[m] for n, v in vecs.items() if m in v.modules}
        space, own = Subspace.of(list(terms.values()), specs[m].shape, keep_bases=keep, device=ws.device)
        proj = dict(zip(terms, own))
        out = {}
        for k, form in forms.items():
            x = space.zero()
            for n in form.names():
                if n in proj and form.coeffs[n] != 0.0:
                    x = x + proj[n] * form.coeffs[n]
            scales = max((abs(t.scale) for n, t in terms.items() if n in form.coeffs), default=0.0)
            check_magnitude(m, f"{k} ({form})", x.C, "keep the expression's coefficients and the inputs' scales "
                            f"(lora_alpha / r, here up to {scales:.3g}) in a sane range")
            out[k] = x
        return out

    per = map_modules(module_cores, names, progress)
    operands = {k: TaskVector({m: per[m][k] for m in names}, specs) for k in forms}
    ev = Evaluation(recipe, method, inputs, tuple(names), specs, operands, vecs,
                    {k: v for k, v in missing.items() if v}, ws.adapter(order[0], recipe.modules_to_save))
    if not method.stepped:
        return ev
    consensus = None
    if recipe.consensus:
        c = recipe.consensus
        consensus = decide(c.ref, agreement_rows(operands["ref"], operands["dir"], names), c.on_disagree,
                           c.min_agree)
    drop = set(consensus.dropped if consensus else ())
    params = recipe.params

    def shaped(m: str, d: InSpan) -> InSpan:
        if m in drop:
            return d * 0.0
        ref = operands["ref"][m] if "ref" in operands else None
        return method.module(ModuleOperands(m, operands["base"][m], d, ref), params)

    direction = operands["dir"].map(shaped)
    zeroed = tuple(m for m in names if m not in drop and direction[m].norm() == 0.0 and operands["dir"][m].norm() > 0)
    step = choose_step(operands["base"], direction, trust=recipe.trust, alpha=recipe.alpha, scope=recipe.trust_scope)
    return Evaluation(recipe, method, inputs, tuple(names), specs, operands, vecs, ev.missing, ev.template,
                      consensus, direction, step, zeroed)


def intended_core(ev: Evaluation, m: str, multiple: float) -> tuple[InSpan, InSpan | None]:
    """``(intended_m, step_m)`` as cores: ``base_m + multiple * alpha_m * dir'_m`` and the step (None without one).

    Both are checked to lie in float64's safe range (``lowrank.check_magnitude``: NumericError otherwise).

    Args:
        ev (Evaluation): the evaluated recipe. m (str): a module. multiple (float): the output's dose.
    """
    if ev.step is None:
        x = ev.operands
        target = ev.method.module(ModuleOperands(m, x["base"][m], None, None), ev.recipe.params)
        check_magnitude(m, "the intended update", target.C, "use smaller coefficients")
        return target, None
    step_m = ev.direction[m] * (ev.step.module_alpha[m] * multiple)
    check_magnitude(m, "the step (alpha * dir)", step_m.C, "use an --alpha (or --trust) of a sane size")
    target = ev.operands["base"][m] + step_m
    check_magnitude(m, "the intended update", target.C, "use a smaller --alpha (or --trust)")
    return target, step_m


def intended(ev: Evaluation, m: str, multiple: float) -> tuple[LowRank, LowRank | None]:
    """``intended_core`` as factors (rank p: the module's basis), for checks that want a LowRank."""
    target, step_m = intended_core(ev, m, multiple)
    return target.lowrank(), None if step_m is None else step_m.lowrank()
