"""``multislerp``: mergekit 0.1.5's Multi-SLERP of any number of models' updates, exact on the cores."""

from __future__ import annotations

from .base import Field, Method
from .registry import register
from .spherical_common import count_models

NORMALIZE_WEIGHTS = Field("normalize_weights", "Multi-SLERP: weights divided by their sum (mergekit's default "
                          "true)", kind="bool", default=True)
EPS = Field("eps", "Multi-SLERP: mergekit's eps added to the norms (default 1e-8)", default=1e-8, low=0.0)


@register
class Multislerp(Method):
    """``linalg/spherical.multislerp`` of the models' cores with their weights (the bases are orthonormal)."""

    name = "multislerp"
    summary = "Multi-SLERP: barycentric interpolation of the updates on the sphere, at their mean norm (mergekit's)"
    operands = ("models",)
    fields = (NORMALIZE_WEIGHTS, EPS)

    def validate(self, recipe):
        p = count_models(recipe, self.name, 1)
        if any(e.get("density") is not None for e in recipe.models or []):
            p.append("method=multislerp: takes no density; drop it from models")
        return p

    def module(self, x, params):
        import torch

        from ..errors import MergeArgumentError
        from ..linalg.spherical import multislerp
        from ..linalg.subspace import InSpan

        try:
            C = multislerp(torch.stack([m.C for m in x.models]), x.weights, params.get("normalize_weights", True),
                           params.get("eps", 1e-8))
        except ValueError as e:
            raise MergeArgumentError(f"module {x.name}: {e}") from None
        floor = sum(abs(w) * m.floor for w, m in zip(x.weights, x.models))
        return InSpan(C, x.models[0].space, floor)
