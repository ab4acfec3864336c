"""The trust-region step from a backbone: how alpha is chosen, and the numbers that justify it.

The step is ``written_m = base_m + alpha_m * dir'_m`` where ``dir'`` is the direction after the
consensus mask and the method (``methods/``), and alpha is chosen last:

- global trust T:  ``alpha = T * ||base|| / ||dir'||`` (Frobenius norms over all modules), so
  ``||alpha dir'|| / ||base|| = T`` exactly;
- module trust T:  ``alpha_m = T * ||base_m|| / ||dir'_m||``, each module moving T of its own norm;
- ``--alpha A``:   alpha = A; with a trust T as well, ``|alpha| <= alpha_T`` and ``clipped`` says so.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

from ..errors import Problem, RecipeError
from ..workspace.taskvector import TaskVector


def trust_alpha(base_norm: float, dir_norm: float, trust: float) -> float:
    """``alpha = trust * ||base|| / ||dir||`` (0 when the direction is zero)."""
    return 0.0 if dir_norm == 0.0 else trust * base_norm / dir_norm


@dataclass
class StepSize:
    """The chosen alpha and the numbers that justify it.

    Args:
        alpha (float | None): the global alpha (None with module scope).
        module_alpha (dict[str, float]): alpha per module (equal to ``alpha`` with global scope).
        trust (float | None), scope (str), requested_alpha (float | None): what was asked.
        clipped (bool): the requested alpha exceeded the trust bound and was reduced.
        base_norm (float), dir_norm (float): ``||base||``, ``||dir'||`` over all modules.
    """

    alpha: float | None
    module_alpha: dict
    trust: float | None
    scope: str
    requested_alpha: float | None
    clipped: bool
    base_norm: float
    dir_norm: float
    base_module_norms: dict = field(default_factory=dict)
    dir_module_norms: dict = field(default_factory=dict)

    def realized(self, multiple: float = 1.0) -> dict:
        """Relative step ``||a dir'|| / ||base||``: global, and min/median/max over modules."""
        per = {}
        total = 0.0
        for m, a in self.module_alpha.items():
            s = abs(a * multiple) * self.dir_module_norms[m]
            total += s * s
            b = self.base_module_norms[m]
            if b > 0 and self.dir_module_norms[m] > 0:
                per[m] = s / b
        vals = sorted(per.values())
        rel = math.sqrt(total) / self.base_norm if self.base_norm > 0 else float("inf")
        return {"global": rel, "step_norm": math.sqrt(total),
                "module_min": vals[0] if vals else 0.0,
                "module_median": statistics.median(vals) if vals else 0.0,
                "module_max": vals[-1] if vals else 0.0}


def choose_step(base: TaskVector, direction: TaskVector, *, trust: float | None = None,
                alpha: float | None = None, scope: str = "global") -> StepSize:
    """Pick alpha by trust region and/or explicit value (see the module docstring).

    Args:
        base (TaskVector): the backbone. direction (TaskVector): ``dir'``, after mask and mode.
        trust (float | None): relative step T. alpha (float | None): explicit alpha.
        scope (str): ``global`` or ``module`` (module needs ``trust``).
    """
    if trust is None and alpha is None:
        raise RecipeError([Problem("give {trust} (a relative step such as 0.0113) or {alpha}")])
    bn, dn = base.module_norms(), direction.module_norms()
    base_norm = math.sqrt(sum(v * v for v in bn.values()))
    dir_norm = math.sqrt(sum(v * v for v in dn.values()))
    clipped = False
    if dir_norm == 0.0:
        raise RecipeError([Problem("{dir}: the direction is zero in every module (after mask and mode); nothing to "
                                   "step along (check the expression, e.g. v51 - v28, and --on-disagree)")])
    if base_norm == 0.0 and trust is not None:
        raise RecipeError([Problem("{trust}: the backbone is zero, so a step relative to it is empty; use --alpha")])
    if scope == "global":
        if alpha is not None:
            a = alpha
        elif trust is not None:
            a = trust_alpha(base_norm, dir_norm, trust)
        else:
            raise RecipeError([Problem("a step needs {trust} or {alpha}")])
        if alpha is not None and trust is not None:
            bound = trust_alpha(base_norm, dir_norm, trust)
            if abs(alpha) > bound:
                a, clipped = math.copysign(bound, alpha), True
        return StepSize(a, {m: a for m in dn}, trust, scope, alpha, clipped, base_norm, dir_norm, bn, dn)
    if trust is None:
        raise RecipeError([Problem("{trust_scope=}module needs {trust}")])
    per = {}
    for m in dn:
        bound = trust_alpha(bn[m], dn[m], trust)
        a = bound
        if alpha is not None:
            a = alpha
            if abs(alpha) > bound:
                a, clipped = math.copysign(bound, alpha), True
        per[m] = a
    return StepSize(None, per, trust, scope, alpha, clipped, base_norm, dir_norm, bn, dn)
