"""``svd``: the weighted sum of ``linear``, cut to ``rank`` by its SVD (optimal, Eckart-Young): PEFT's ``svd``."""

from __future__ import annotations

from ..errors import Problem
from .base import Method, weighted
from .linear import weighted_sum
from .registry import register


@register
class Svd(Method):
    """``cut_k(sum_i w_i DeltaW_i)``: the best rank-k approximation of the weighted sum (k from ``rank``)."""

    name = "svd"
    summary = "the weighted sum cut to --rank by its SVD (optimal; the cut's error is reported)"
    operands = ("models",)

    def validate(self, recipe):
        if "rank" not in recipe.given:
            return [Problem("{method=}svd: needs {rank} (e.g. --rank 32; PEFT's svd uses the largest input rank), "
                            "or use method linear for the exact sum")]
        return []

    def module(self, x, params):
        return weighted_sum(x)

    def linear_terms(self, weights, params):
        return weighted(weights)
