"""``magnitude_prune``: each model trimmed to its top ``density`` entries by magnitude, then summed with weights."""

from __future__ import annotations

from .elementwise import Elementwise
from .registry import register


@register
class MagnitudePrune(Elementwise):
    """``sum_i w_i T_i``, T_i the top-``density`` entries of model i by magnitude (PEFT's ``magnitude_prune``)."""

    name = "magnitude_prune"
    summary = "keep each model's top --density entries by magnitude, then the weighted sum"
    drop = "magnitude"
    combine = "sum"
