"""``karcher``: the Karcher (Riemannian) mean of the models' updates on the sphere, as mergekit 0.1.5's ``karcher``.

mergekit averages the full weights; on LoRA adapters vecmerge averages the updates (the base at the
origin), with mergekit's equal weights ``1 / n`` and its ``max_iter`` and ``tol``. Every iterate is a
combination of the inputs, so it runs exactly on the module's cores (``linalg/spherical.karcher``).
"""

from __future__ import annotations

from .base import Field, Method
from .registry import register
from .spherical_common import count_models, no_weights

MAX_ITER = Field("max_iter", "Karcher: most gradient steps (mergekit's default 10)", kind="int", default=10, low=0)
TOL = Field("tol", "Karcher: stop when the tangent's norm is below this (mergekit's default 1e-5)", default=1e-5,
            low=0.0)


@register
class Karcher(Method):
    """``(mean_i ||x_i||) * m``, m the Karcher mean of the unit updates (see the module docstring)."""

    name = "karcher"
    summary = "Karcher mean of the updates on the unit sphere, scaled to their mean norm (mergekit's)"
    operands = ("models",)
    fields = (MAX_ITER, TOL)

    def validate(self, recipe):
        return count_models(recipe, self.name, 1) + no_weights(recipe, self.name)

    def module(self, x, params):
        import torch

        from ..linalg.spherical import karcher
        from ..linalg.subspace import InSpan

        n = len(x.models)
        C = karcher(torch.stack([m.C for m in x.models]), [1.0 / n] * n, params.get("max_iter", 10),
                    params.get("tol", 1e-5))
        return InSpan(C, x.models[0].space, sum(m.floor for m in x.models))
