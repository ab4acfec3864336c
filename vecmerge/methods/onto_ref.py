"""``onto-ref``: step only along the reference trajectory, and only where the direction agrees with it."""

from __future__ import annotations

from ..errors import Problem
from .base import Method
from .registry import register


def along(x, onto) -> float:
    """``<x, onto> / ||onto||^2``: the coefficient of x's component along ``onto`` (0 if onto is zero)."""
    n = onto.norm()
    return 0.0 if n == 0.0 else x.inner(onto) / (n * n)


@register
class OntoRef(Method):
    """``dir'_m = max(<dir_m, ref_m> / ||ref_m||^2, 0) * ref_m``: dir's component along ref, positive part only."""

    name = "onto-ref"
    summary = ("step along the consensus reference only (needs --consensus-ref): each module takes dir's "
               "component along ref_m, (<dir_m, ref_m> / ||ref_m||^2) ref_m, and no step where it is negative")
    operands = ("base", "dir", "ref")
    stepped = True
    zero_reason = ("there the direction points against the reference, <dir_m, ref_m> <= 0, and onto-ref keeps "
                   "only a positive component along ref_m")

    def validate(self, recipe):
        return [] if recipe.consensus else [Problem("{mode=}onto-ref: needs {consensus.ref} (the reference "
                                                    "trajectory)")]

    def module(self, x, params):
        c = along(x.dir, x.ref)
        return x.ref * max(c, 0.0) if c > 0 else x.dir * 0.0
