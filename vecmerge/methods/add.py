"""``add``: the plain step ``base + alpha * dir`` (the user's v58)."""

from __future__ import annotations

from .base import Method
from .registry import register


@register
class Add(Method):
    """``dir'_m = dir_m``: step along the direction as it is."""

    name = "add"
    summary = "step along DIR as it is: base + alpha * dir"
    operands = ("base", "dir")
    stepped = True

    def module(self, x, params):
        return x.dir

    def linear_terms(self, weights, params):
        return {"dir": 1.0}
