"""``expression``: any linear expression of adapters, re-factored as it is (``vecmerge refactor``)."""

from __future__ import annotations

from .base import Method
from .registry import register


@register
class Expression(Method):
    """The update is the expression ``base`` itself, e.g. ``0.5*v16 + 0.5*v28``."""

    name = "expression"
    summary = "the expression itself (e.g. 0.5*v16 + 0.5*v28), re-factored to the chosen rank"
    operands = ("base",)

    def module(self, x, params):
        return x.base

    def linear_terms(self, weights, params):
        return {"base": 1.0}
