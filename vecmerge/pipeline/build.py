"""One output of an evaluated recipe: per module the intended update, the rank cut, the dtype rounding.

For every module m (one at a time, so a large model holds one module's bases)::

    T_m = intended_m                        (evaluate.intended_core, exact)
    R_m = cut(T_m, rank policy)             (rankcut.cut: factors of the chosen rank)
    W_m = R_m rounded to the output dtype   (export.prepare_modules: the tensors to store)

and ``figures`` measures what survived. A dense ``T_m`` is cut by a randomized SVD seeded per module
(``module_seed(CUT_SEED, m)``), factors (``LowRank``) by their SVD; ``cat`` writes the models' own factors.
A MoE parameter's experts are cut again at their common rank (``experts.py``) and packed into PEFT's
layout. Nothing is written here. More: docs/design/pipeline.md.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..linalg.dense import Dense
from ..linalg.lowrank import LowRank, check_magnitude
from ..linalg.merge_kernels import module_seed
from ..linalg.rank_policy import RankPolicy
from ..linalg.rankcut import Cut, cut
from ..linalg.subspace import InSpan
from ..linalg.threads import Progress, map_modules
from ..peft.write import WrittenModule, bias_tensor, pack_params, prepare_modules
from .bias import has_biases, intended_bias
from .evaluation import Evaluation, intended_core, method_params, module_operands
from .experts import common_ranks, expert_figures
from .figures import check_figures, figures, module_figures, rounding, rounding_norm

CUT_SEED = 0  # the randomized SVD's seed: module m uses module_seed(CUT_SEED, m)


@dataclass(frozen=True)
class ModuleBuild:
    """One module of one output.

    Args:
        cut (Cut): the re-factored update R_m. written (WrittenModule): W_m as stored (both without their
            factors once streamed to the file: ``slim``).
        rounding (float): ``||W_m - R_m||_F``. rounding_core (Tensor | None): (p, q) its projection on the
        basis (None for a dense target). target (InSpan | None): the intended update T_m as a core (None
        for a dense target, released once measured: one module's dense matrix at a time).
        step (InSpan | None): the step in it.
        error (float | None): ``||W_m - T_m||_F`` measured directly (dense targets; None: from the cores).
        inner (float | None): ``<W_m, T_m>`` measured directly (dense targets).
        moved (tuple | None): a merge: per model i, ``(||T_m - x_i||^2, ||x_i||^2)`` (the intended merge
            against each model's own update).
        target_norm (float | None): ``||T_m||_F`` (dense targets, whose matrix is not kept).
        figure (tuple | None): ``figures.module_figures`` of this build (its entry and its parts of the sums).
    """

    cut: Cut
    written: WrittenModule
    rounding: float
    rounding_core: torch.Tensor | None
    target: InSpan | None
    step: InSpan | None
    error: float | None = None
    inner: float | None = None
    moved: tuple | None = None
    target_norm: float | None = None
    figure: tuple | None = None

    def slim(self) -> ModuleBuild:
        """This build once written: its figures (``figure``), ranks and norms, without its arrays (the cut's
        float64 factors, the stored tensors, the cores), so a whole model's builds take little memory.

        A slim build's ``cut.factors`` and ``written.lowrank`` are None, which their types (the arrays of a
        live build) do not say: the two ignores below mark that on purpose, nothing reads them once slim."""
        cut = dataclasses.replace(self.cut, factors=None, cores=None, kept=None)  # type: ignore[arg-type]
        written = dataclasses.replace(self.written, lowrank=None)  # type: ignore[arg-type]
        return dataclasses.replace(self, cut=cut, written=written, rounding_core=None, target=None, step=None)


@dataclass(frozen=True)
class BuiltOutput:
    """Everything needed to write one output and report on it.

    Args:
        multiple (float): the dose (alpha multiplier). tensors (dict[str, Tensor]): the safetensors content
            (empty when a sink took each module's tensors as they were made).
        modules (dict[str, ModuleBuild]): per module, in order. figures (dict): see ``figures.figures``.
    """

    multiple: float
    tensors: dict
    modules: dict
    figures: dict

    @property
    def written(self) -> dict[str, WrittenModule]:
        """``{module: WrittenModule}``, in module order."""
        return {m: b.written for m, b in self.modules.items()}


def build_output(ev: Evaluation, multiple: float, progress: Progress | None = None, *,
                 sink: Callable[[str, dict], None] | None = None,
                 check: Callable[[str, ModuleBuild, dict], None] | None = None) -> BuiltOutput:
    """Cut, round and measure every module of one output.

    Args:
        ev (Evaluation): the evaluated recipe. multiple (float): the dose of this output.
        progress: optional callable wrapping the module iterable (a tqdm bar).
        sink (callable | None): ``sink(module, {key: tensor})`` takes each module's tensors as soon as they
            are made (from worker threads, in any order; ``export.WeightsStream.put``); the build then keeps
            only the small cores and figures of each module (``ModuleBuild.slim``) and ``tensors`` stays
            empty. Not for adapters with ``target_parameters``, whose experts are packed together at the end.
        check (callable | None): ``check(module, ModuleBuild, {key: tensor})``, called for each module
            before its tensors go to the sink (``runner.module_check``: refuse an output verify would fail).
    """
    recipe = ev.recipe
    policy = recipe.rank_policy
    keep = tuple(ev.names) if policy.kind == "keep-base" else ()
    backbone = ev.vectors[ev.base_name]
    params = any(s.param for s in ev.specs.values())
    if sink is not None and params:
        raise TypeError("build_output: target_parameters outputs are packed at the end; pass no sink")
    per_module: dict = {}  # module -> its tensors (filled from worker threads; ordered below)
    biased = has_biases(ev)  # lora_bias inputs: every module also stores its bias update (pipeline.bias)

    def one(m: str, rank: int | None = None) -> ModuleBuild:
        target, step_m = intended_core(ev, m, multiple)
        given = None if ev.step is not None else ev.method.factors(module_operands(ev, m), method_params(ev, m))
        if given is not None:
            if not isinstance(target, InSpan):  # a method that gives factors (cat) gives its update as a core
                raise ValueError(f"{ev.method.name}: {m}: factors to write as they are, but no core to measure")
            k = ev.multipliers.get(m, 1.0)
            c = as_is(target, given * k if k != 1.0 else given)
        elif isinstance(target, Dense):
            c = cut(target, policy, seed=module_seed(CUT_SEED, m), rank=rank)
        else:
            c = cut(target, policy, backbone=backbone.modules.get(m), step=step_m, rank=rank)
        for name, factor in (("B", c.factors.B), ("A", c.factors.A)):
            check_magnitude(m, f"the re-factored {name}", factor, "report this with the recipe")
        t, w = prepare_modules({m: c.factors}, ev.specs, recipe.dtype, keep)
        if biased:
            key, t[key] = bias_tensor(m, intended_bias(ev, m, multiple), w[m], recipe.dtype)
        moved = None
        if ev.model_keys:
            xs = [ev.operands[k][m] for k in ev.model_keys]
            if isinstance(target, Dense):  # ||T - x||^2 = ||T||^2 - 2 <Qb^T T Qa, C_x> + ||C_x||^2
                P, tn2 = target.in_basis(xs[0].space), target.norm() ** 2
                moved = tuple((max(tn2 - 2.0 * float((P * x.C).sum()) + x.norm() ** 2, 0.0), x.norm() ** 2)
                              for x in xs)
            elif isinstance(target, LowRank):  # factors outside the module's basis (a per-row merge)
                moved = tuple(((target - x.lowrank()).norm() ** 2, x.norm() ** 2) for x in xs)
            else:
                moved = tuple(((target - x).norm() ** 2, x.norm() ** 2) for x in xs)
        if isinstance(target, Dense):
            W = w[m].lowrank
            b = ModuleBuild(c, w[m], rounding_norm(W, c.factors), None, None, None, target.distance(W),
                            target.inner(W), moved, target.norm())
        elif isinstance(target, LowRank):
            W = w[m].lowrank
            b = ModuleBuild(c, w[m], rounding_norm(W, c.factors), None, None, None, (W - target).norm(),
                            W.inner(target), moved, target.norm())
        else:
            e_norm, e_core = rounding(w[m].lowrank, c.factors, target.space, c.cores)
            target.space.release()  # one module's full-size bases at a time
            b = ModuleBuild(c, w[m], e_norm, e_core, target, step_m, moved=moved)
        b = dataclasses.replace(b, figure=module_figures(ev, m, b))
        if check is not None:
            check(m, b, t)
        if sink is None:
            per_module[m] = t
            return b
        sink(m, t)
        return b.slim()

    rows = map_modules(one, list(ev.names), progress)
    tensors = {k: v for m in ev.names if m in per_module for k, v in per_module[m].items()}
    if not params:  # no target_parameters: nothing to group
        fig = figures(ev, rows)
        check_figures(fig)
        return BuiltOutput(multiple, tensors, rows, fig)
    common = common_ranks(rows, ev.specs)
    own = {m: rows[m] for m in common}
    own_fig = figures(ev, rows) if common else None
    rows.update(map_modules(lambda m: one(m, common[m]), list(common)))
    tensors.update(pack_params({m: b.written for m, b in rows.items()}, ev.specs))
    fig = figures(ev, rows)
    if any(s.kind == "expert" for s in ev.specs.values()):
        fig["experts"] = expert_figures(own, rows, ev.specs, own_fig)
    check_figures(fig)
    return BuiltOutput(multiple, tensors, rows, fig)


def as_is(target: InSpan, factors: LowRank) -> Cut:
    """A Cut that writes ``factors`` as they are (``cat``): no SVD, so no error beyond float64 round-off.

    The exact rank is the target's (from its core); the kept part is the target itself.

    Args:
        target (InSpan): the intended update (the same sum as ``factors``). factors (LowRank): what to write.
    """
    S = target.singular_values()
    _, exact = RankPolicy("exact").choose(S, target.floor)
    return Cut(factors, factors.rank, exact, 0.0, target.norm(), target.C, method="factors")
