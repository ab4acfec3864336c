"""``ties``: TIES-merging (Yadav et al. 2023): trim to ``density`` by magnitude, elect signs, disjoint mean."""

from __future__ import annotations

from .elementwise import DENSITY, LAMBDA, MAJORITY, NORMALIZE, RESCALE, SPACE, Elementwise
from .registry import register


@register
class Ties(Elementwise):
    """``sum_i A_i w_i T_i / max(1, sum_i A_i)``: T_i model i's top-``density`` entries, A_i = [sign(T_i) = s].

    With ``normalize`` given, mergekit's ``ties``: ``sum_i A_i w_i T_i / sum_i A_i w_i`` (true) or the plain
    sum of the agreeing ``w_i T_i`` (false), the sign elected on the weighted ``w_i T_i`` (``linalg/gta.py``).
    """

    name = "ties"
    summary = ("TIES: keep each model's top --density entries by magnitude, elect each entry's sign, average "
               "the agreeing weighted entries (PEFT's rule; --normalize: mergekit's)")
    fields = (DENSITY, SPACE, MAJORITY, NORMALIZE, RESCALE, LAMBDA)
    drop = "magnitude"
    combine = "ties"
