"""``slerp``: spherical interpolation between two models, exact in factored form.

``slerp(x0, x1, t) = c0 x0 + c1 x1`` with ``c0 = sin((1-t) theta) / sin theta``, ``c1 = sin(t theta) /
sin theta``, ``cos theta = <x0, x1> / (||x0|| ||x1||)`` (mergekit's definition, on the unnormalized
updates; linear interpolation when the two are nearly colinear or one is zero): only norms and one
inner product, so it runs on the cores. ``slerp_scope: module`` takes theta per module (mergekit's
per-tensor slerp); ``global`` takes it from the whole adapters (norms and inner products summed over
modules) and applies one (c0, c1) everywhere (recorded in the manifest).
"""

from __future__ import annotations

import math

from ..errors import Problem
from .base import Field, Method
from .registry import register

T = Field("t", "interpolation parameter: 0 gives the first model, 1 the second")
SCOPE = Field("slerp_scope", "module: the angle per module; global: one angle from the whole adapters",
              kind="str", default="module", choices=("module", "global"))


def _coefficients(n0: float, n1: float, inner: float, t: float) -> tuple[float, float]:
    from ..linalg.merge_kernels import slerp_coefficients

    return slerp_coefficients(n0, n1, inner, t)


@register
class Slerp(Method):
    """``c0 x0 + c1 x1`` with SLERP's coefficients (see the module docstring)."""

    name = "slerp"
    summary = "spherical interpolation between two models at --t, per module or global (exact)"
    operands = ("models",)
    fields = (T, SCOPE)

    def validate(self, recipe):
        p = []
        models = recipe.models or []
        if len(models) != 2:
            p.append(Problem("{method=}slerp: interpolates between exactly two models, got {}", len(models)))
        if recipe.params.get("t") is None and "t" not in recipe.given:
            p.append(Problem("{method=}slerp: needs {t} (e.g. --t 0.5: halfway along the arc)"))
        if any(e.get("weight", 1.0) != 1.0 for e in models):
            p.append(Problem("{method=}slerp: takes t, not weights; drop the {weights}"))
        if any(e.get("density") is not None for e in models):
            p.append(Problem("{method=}slerp: takes no density; drop it from models"))
        return p

    def warnings(self, params):
        t = params.get("t")
        if t is not None and not 0.0 <= t <= 1.0:
            return [f"slerp at t={t:g} extrapolates beyond the arc between the two models (t in [0, 1] "
                    "interpolates between them)"]
        return []

    def prepare(self, modules, params):
        if params.get("slerp_scope") != "global":
            return params
        n0 = n1 = inner = 0.0
        for x in modules.values():
            a, b = x.models
            n0, n1, inner = n0 + a.norm() ** 2, n1 + b.norm() ** 2, inner + a.inner(b)
        c0, c1 = _coefficients(math.sqrt(n0), math.sqrt(n1), inner, params["t"])
        return {**params, "c0": c0, "c1": c1}

    def module(self, x, params):
        a, b = x.models
        if "c0" in params:
            c0, c1 = params["c0"], params["c1"]
        else:
            c0, c1 = _coefficients(a.norm(), b.norm(), a.inner(b), params["t"])
        return a * c0 + b * c1
