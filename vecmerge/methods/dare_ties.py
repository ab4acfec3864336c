"""``dare_ties``: DARE's random drop and rescale, then TIES' sign election and disjoint mean."""

from __future__ import annotations

from .elementwise import DENSITY, MAJORITY, SEED, SPACE, Elementwise
from .registry import register


@register
class DareTies(Elementwise):
    """``T_i = X_i * Bernoulli(d_i) / d_i``, then ``sum_i A_i w_i T_i / max(1, sum_i A_i)`` (PEFT's ``dare_ties``)."""

    name = "dare_ties"
    summary = "DARE's drop and rescale (--density, --seed), then TIES' sign election and disjoint mean"
    fields = (DENSITY, SPACE, MAJORITY, SEED)
    drop = "random"
    combine = "ties"
