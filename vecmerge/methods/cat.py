"""``cat``: the models' own factors side by side, ``B = [w_i s_i B_i]``, ``A = [A_i]``: exact, rank sum_i r_i."""

from __future__ import annotations

from ..errors import Problem
from .base import Method, weighted
from .linear import weighted_sum
from .registry import register


@register
class Cat(Method):
    """``sum_i w_i DeltaW_i`` written as the concatenated factors, with no SVD (PEFT's ``cat``, rsLoRA scaled right)."""

    name = "cat"
    summary = "the weighted sum written as the models' own factors side by side (exact; rank = the sum of ranks)"
    operands = ("models",)

    def validate(self, recipe):
        if recipe.rank != "exact":
            return [Problem("{method=}cat: writes the models' factors as they are (rank = the sum of their ranks), "
                            "so {rank=}{} does not apply; use method linear or svd to cut", repr(recipe.rank))]
        return []

    def module(self, x, params):
        return weighted_sum(x)

    def linear_terms(self, weights, params):
        return weighted(weights)

    def factors(self, x, params):
        from ..linalg.lowrank import LowRank, combine

        parts = [(w * c, t) for w, terms in zip(x.weights, x.terms) for c, t in terms]
        return combine(parts) if parts else LowRank.zeros(x.models[0].shape, x.models[0].space.device)
