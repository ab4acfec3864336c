"""One output of an evaluated recipe: per module the intended update, the rank cut, the dtype rounding.

For every module m (one at a time, so a large model holds one module's bases)::

    T_m = intended_m                        (evaluate.intended_core, exact)
    R_m = cut(T_m, rank policy)             (rankcut.cut: factors of the chosen rank)
    W_m = R_m rounded to the output dtype   (export.prepare_modules: the tensors to store)

and ``figures`` measures what survived (see ``figures.py``). Nothing is written here.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..export import WrittenModule, prepare_modules
from ..kernels import map_modules
from ..lowrank import check_magnitude
from ..rankcut import Cut, cut
from ..subspace import InSpan
from .evaluation import Evaluation, intended_core
from .figures import check_figures, figures, rounding


@dataclass(frozen=True)
class ModuleBuild:
    """One module of one output.

    Args:
        cut (Cut): the re-factored update R_m. written (WrittenModule): W_m as stored.
        rounding (float): ``||W_m - R_m||_F``. rounding_core (Tensor): (p, q) its projection on the basis.
        target (InSpan): the intended update T_m. step (InSpan | None): the step in it.
    """

    cut: Cut
    written: WrittenModule
    rounding: float
    rounding_core: torch.Tensor
    target: InSpan
    step: InSpan | None


@dataclass(frozen=True)
class BuiltOutput:
    """Everything needed to write one output and report on it.

    Args:
        multiple (float): the dose (alpha multiplier). tensors (dict[str, Tensor]): the safetensors content.
        modules (dict[str, ModuleBuild]): per module, in order. figures (dict): see ``figures.figures``.
    """

    multiple: float
    tensors: dict
    modules: dict
    figures: dict

    @property
    def written(self) -> dict:
        """``{module: WrittenModule}``, in module order."""
        return {m: b.written for m, b in self.modules.items()}


def build_output(ev: Evaluation, multiple: float, progress=None) -> BuiltOutput:
    """Cut, round and measure every module of one output (no file I/O).

    Args:
        ev (Evaluation): the evaluated recipe. multiple (float): the dose of this output.
        progress: optional callable wrapping the module iterable (a tqdm bar).
    """
    recipe = ev.recipe
    policy = recipe.rank_policy
    keep = tuple(ev.names) if policy.kind == "keep-base" else ()
    backbone = ev.vectors[ev.base_name]
    tensors = {}

    def one(m: str) -> ModuleBuild:
        target, step_m = intended_core(ev, m, multiple)
        c = cut(target, policy, backbone=backbone.modules.get(m), step=step_m)
        for name, factor in (("B", c.factors.B), ("A", c.factors.A)):
            check_magnitude(m, f"the re-factored {name}", factor, "report this with the recipe")
        t, w = prepare_modules({m: c.factors}, ev.specs, recipe.dtype, keep)
        tensors.update(t)
        e_norm, e_core = rounding(w[m].lowrank, c.factors, target.space)
        target.space.release()  # one module's full-size bases at a time
        return ModuleBuild(c, w[m], e_norm, e_core, target, step_m)

    rows = map_modules(one, list(ev.names), progress)
    fig = figures(ev, rows)
    check_figures(fig)
    return BuiltOutput(multiple, tensors, rows, fig)
