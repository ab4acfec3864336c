"""``linear``: task arithmetic, ``sum_i w_i x_i`` of the models' updates (exact, in factored form)."""

from __future__ import annotations

from .base import Method, weighted
from .registry import register


def weighted_sum(x):
    """``sum_i w_i x_i`` of a module's model cores (an InSpan)."""
    out = x.models[0] * x.weights[0]
    for w, m in zip(x.weights[1:], x.models[1:]):
        out = out + m * w
    return out


@register
class Linear(Method):
    """``sum_i w_i DeltaW_i``: the weighted sum of the updates themselves (not of the factors, as PEFT's ``linear``)."""

    name = "linear"
    summary = "task arithmetic: the weighted sum of the models' updates, exact (written at --rank, default exact)"
    operands = ("models",)

    def module(self, x, params):
        return weighted_sum(x)

    def linear_terms(self, weights, params):
        return weighted(weights)
