"""``nuslerp``: mergekit 0.1.5's NuSLERP between two models' updates, t = w_1 / (w_0 + w_1).

``nuslerp_flatten: true`` (mergekit's default) takes one angle per module (its whole update, from the
cores: exact in the module's basis); ``false`` one per row, or per column with ``nuslerp_row_wise: true``
(mergekit's ``dim=0``), from ``Qb C_i`` or ``C_i Qa^T``: exact, written as factors. The coefficients are
``linalg/spherical.nuslerp_coefficients``: colinear below ``1 - cos^2 = 1e-16`` (``slerp``'s threshold is
``|cos| > 0.9995``), and both weights are read from the models (``slerp`` takes ``t``).
"""

from __future__ import annotations

from .base import Field, Method
from .registry import register
from .spherical_common import cols_of, count_models, from_cols, from_rows, rows_of

FLATTEN = Field("nuslerp_flatten", "NuSLERP: one angle per module (mergekit's default true); false: per row",
                kind="bool", default=True)
ROW_WISE = Field("nuslerp_row_wise", "NuSLERP without flatten: per column instead of per row (mergekit's "
                 "default false)", kind="bool", default=False)
TOTAL_EPS = 1e-6  # mergekit's: |w_0 + w_1| below this gives t = 0.5


def nuslerp_t(weights) -> float:
    """``w_1 / (w_0 + w_1)``, 0.5 where the sum is below 1e-6 (mergekit's)."""
    total = weights[0] + weights[1]
    return 0.5 if abs(total) < TOTAL_EPS else weights[1] / total


@register
class Nuslerp(Method):
    """``c0 x0 + c1 x1`` with NuSLERP's coefficients at ``t = w_1 / (w_0 + w_1)`` (see the module docstring)."""

    name = "nuslerp"
    summary = ("NuSLERP: spherical interpolation of two models at t = w1 / (w0 + w1), per module, row or column "
               "(mergekit's)")
    operands = ("models",)
    fields = (FLATTEN, ROW_WISE)

    def validate(self, recipe):
        p = count_models(recipe, self.name, 2, 2)
        if any(e.get("density") is not None for e in recipe.models or []):
            p.append("method=nuslerp: takes no density; drop it from models")
        return p

    def module(self, x, params):
        import torch

        from ..linalg.spherical import nuslerp_coefficients

        t = nuslerp_t(x.weights)
        a, b = x.models
        if params.get("nuslerp_flatten", True):
            f = torch.tensor
            c0, c1 = nuslerp_coefficients(f(a.norm()), f(b.norm()), f(a.inner(b)), t)
            return a * float(c0) + b * float(c1)
        if params.get("nuslerp_row_wise"):
            R0, R1 = cols_of(x)
            c0, c1 = nuslerp_coefficients(R0.norm(dim=0), R1.norm(dim=0), (R0 * R1).sum(dim=0), t)
            return from_cols(x, R0 * c0 + R1 * c1)
        L0, L1 = rows_of(x)
        c0, c1 = nuslerp_coefficients(L0.norm(dim=1), L1.norm(dim=1), (L0 * L1).sum(dim=1), t)
        return from_rows(x, L0 * c0[:, None] + L1 * c1[:, None])
