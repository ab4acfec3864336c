"""``dare_ties``: DARE's random drop and rescale, then TIES' sign election and disjoint mean."""

from __future__ import annotations

from .elementwise import DENSITY, LAMBDA, MAJORITY, NORMALIZE, RESCALE, SEED, SPACE, Elementwise
from .registry import register


@register
class DareTies(Elementwise):
    """``T_i = X_i * Bernoulli(d_i) / d_i``, then ``sum_i A_i w_i T_i / max(1, sum_i A_i)`` (PEFT's ``dare_ties``).

    With ``normalize`` given, mergekit's election on the weighted tasks and its divisor (see ``ties``); the
    drops are rescaled by DARE's ``1 / d`` unless ``rescale`` is given: true, mergekit's L1 rescale (its default,
    which ``merge --config`` fills), false, none.
    """

    name = "dare_ties"
    summary = ("DARE's drop and rescale (--density, --seed), then TIES' sign election and disjoint mean "
               "(PEFT's rule; --normalize: mergekit's)")
    fields = (DENSITY, SPACE, MAJORITY, SEED, NORMALIZE, RESCALE, LAMBDA)
    drop = "random"
    combine = "ties"
