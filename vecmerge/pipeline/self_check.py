"""Would ``vecmerge verify`` refuse this output? Then it is not written, and the message says why.

``ModuleCheck`` measures each module of a lossless output while its factors are in memory
(``||W_m - T_m|| / ||T_m||`` against ``outputs.manifest.TOLERANCES[dtype]["update"]``); ``self_check`` raises
CheckFailed naming the worst module and its cause (``_cause``): an intended update that is zero up to
round-off (the expression cancels: ``a - b`` of one update stored twice), subnormal inputs or outputs, or
plain rounding to the output dtype.
"""

from __future__ import annotations

import torch

from ..errors import CheckFailed
from ..outputs.manifest import TOLERANCES
from ..peft.format import DTYPES, factor_keys
from .build import BuiltOutput, ModuleBuild
from .evaluation import Evaluation, operand_forms
from .figures import module_figures


class ModuleCheck:
    """``build_output``'s per-module check: would ``vecmerge verify`` refuse this module of a lossless output?

    verify accepts ``||W_m - T_m|| / ||T_m|| <= TOLERANCES[dtype]["update"]`` per module; each module is
    measured while its factors are still in memory, and a failing one keeps its relative error and its
    cause (``_cause``) for ``self_check``'s message. Safe to call from worker threads.

    Args:
        ev (Evaluation): the evaluated recipe.
    """

    def __init__(self, ev: Evaluation):
        self.ev = ev
        self.failed: dict[str, tuple[float, str]] = {}  # module -> (rel_error, cause)

    def __call__(self, m: str, b: ModuleBuild, tensors: dict) -> None:
        recipe = self.ev.recipe
        if not recipe.rank_policy.lossless:
            return  # verify compares a rank cut with its recorded error, which always reproduces
        rel = (b.figure or module_figures(self.ev, m, b))[0]["rel_error"]
        if not rel <= TOLERANCES[recipe.dtype]["update"]:
            self.failed[m] = (rel, _cause(self.ev, m, b, tensors))


def self_check(ev: Evaluation, built: BuiltOutput, failed: dict) -> None:
    """CheckFailed if ``vecmerge verify`` would fail this output (a lossless one): nothing is written silently.

    verify accepts ``||W_m - T_m|| / ||T_m|| <= TOLERANCES[dtype]["update"]`` per module (``ModuleCheck``'s
    ``failed``: the worst is named) and a survival within ``TOLERANCES[dtype]["survival"]`` of 1.
    """
    recipe, fig = ev.recipe, built.figures
    if not recipe.rank_policy.lossless:
        return  # verify compares a rank cut with its recorded error, which always reproduces
    tol = TOLERANCES[recipe.dtype]
    if failed:
        m = max(sorted(failed), key=lambda k: failed[k][0])
        raise CheckFailed(f"module {m}: the written {recipe.dtype} update misses the intended one by "
                          f"{failed[m][0]:.3g} of its norm, over the {tol['update']:g} that "
                          f"'vecmerge verify' accepts ({len(failed)} module(s)); nothing written. " + failed[m][1])
    if "survival" in fig and not abs(fig["survival"] - 1.0) <= tol["survival"]:
        raise CheckFailed(f"{fig['survival']:.6g} of the step survives rounding to {recipe.dtype}, off 1 by more "
                          f"than the {tol['survival']:g} that 'vecmerge verify' accepts; nothing written. The step "
                          f"is too small against the backbone for {recipe.dtype} factors: use a larger step"
                          + ("" if recipe.dtype == "fp32" else " or --dtype fp32"))


def _subnormal(t: torch.Tensor) -> int:
    """How many entries of ``t`` are subnormal in its own dtype (non-zero, below the smallest normal)."""
    return int(((t != 0) & (t.abs() < torch.finfo(t.dtype).tiny)).sum()) if t.is_floating_point() else 0


CANCEL_RTOL = 16  # x the inputs' machine epsilon: an intended update below this share of its terms is round-off


def _cancelled(ev: Evaluation, m: str, b: ModuleBuild) -> str | None:
    """Why module ``m``'s intended update is zero up to round-off, or None when it is not.

    ``||T_m|| <= CANCEL_RTOL * eps * sum |c| ||X_m||`` over the terms ``c * X`` of the recipe's expressions
    (``eps``: the coarsest machine epsilon of the inputs' stored factors): the terms cancel (``a - b`` of
    one update stored twice, ``a + (-1)*a``), and what is left is their rounding, which no dtype reproduces.
    """
    terms = [(c, ev.vectors[n].modules[m]) for f in operand_forms(ev.recipe, ev.method).values()
             for n, c in f.coeffs.items() if n in ev.vectors and m in ev.vectors[n].modules]
    scale = sum(abs(c) * x.norm() for c, x in terms)
    eps = max([torch.finfo(x.B.dtype).eps for _, x in terms if x.B.is_floating_point()] or [2.0 ** -52])
    norm = b.target_norm if b.target is None else b.target.norm()
    if norm is None or not scale > 0 or norm > CANCEL_RTOL * eps * scale:
        return None
    return (f"Cause: the intended update is zero up to round-off (its norm {norm:.3g} is {norm / scale:.2g} of "
            f"its terms' {scale:.3g}: the expression cancels, and what is left is the inputs' rounding, which no "
            "dtype reproduces); drop the cancelling terms")


def _cause(ev: Evaluation, m: str, b: ModuleBuild, tensors: dict) -> str:
    """Why module ``m``'s written factors lost precision: an intended update that cancels (``_cancelled``),
    subnormal inputs or outputs, or plain rounding.

    Args:
        ev (Evaluation). m (str): the module. b (ModuleBuild): its build (with its factors).
        tensors (dict[str, Tensor]): its stored tensors (none for a packed expert).
    """
    cancelled = _cancelled(ev, m, b)
    if cancelled is not None:
        return cancelled
    dtype = ev.recipe.dtype
    tiny = torch.finfo(DTYPES[dtype]).tiny
    spec = ev.specs[m]
    exact = b.cut.factors
    stored = [tensors.get(k) for k in factor_keys(m, spec.kind)]  # A, B (absent for a packed expert)
    written = sum(_subnormal(t) + int(((t == 0) & (e.cpu() != 0)).sum())
                  for t, e in zip(stored, (exact.A, exact.B)) if t is not None and t.shape == e.shape)
    inputs = {n: _subnormal(v.modules[m].B) + _subnormal(v.modules[m].A)
              for n, v in ev.vectors.items() if m in v.modules}
    why = [f"input {n} holds {k} subnormal entries in this module (below its dtype's smallest normal number: "
           "its weights underflowed and keep few digits; use another checkpoint)" for n, k in inputs.items() if k]
    if written:
        fix = "scale the update up" if dtype == "fp32" else "use --dtype fp32"
        why.append(f"{written} of the written factors' entries fell below {tiny:.3g}, the smallest normal {dtype} "
                   f"number (the update's norm is {b.target_norm if b.target is None else b.target.norm():.3g}); {fix}")
    return "Cause: " + "; ".join(why) if why else ("Cause: rounding to " + dtype
                                                     + ("; use --dtype fp32" if dtype != "fp32" else ""))
