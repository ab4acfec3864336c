"""``task_arithmetic``: Ilharco et al. 2023 (arXiv 2212.04089) as mergekit names it: ``lambda * sum_i w_i x_i``."""

from __future__ import annotations

from .base import Method, weighted
from .elementwise import LAMBDA
from .generalized import normalize_field
from .linear import weighted_sum
from .registry import register

DIVISOR_EPS = 1e-8  # mergekit's: a sum of weights below this divides by 1 (linalg/gta.py)


@register
class TaskArithmetic(Method):
    """``lambda * sum_i w_i DeltaW_i`` (``/ sum_i w_i`` with normalize): exact, on the cores."""

    name = "task_arithmetic"
    summary = "task arithmetic as mergekit's: lambda times the weighted sum of the updates (--normalize), exact"
    operands = ("models",)
    fields = (LAMBDA, normalize_field(False))

    def module(self, x, params):
        out = weighted_sum(x)
        total = sum(x.weights)
        k = params.get("lambda", 1.0)
        if params.get("normalize") and abs(total) >= DIVISOR_EPS:
            k = k / total
        return out * k if k != 1.0 else out

    def linear_terms(self, weights, params):
        total, k = sum(weights), params.get("lambda", 1.0)
        return weighted(weights, k / total if params.get("normalize") and abs(total) >= DIVISOR_EPS else k)
