"""``dare_linear``: DARE (Yu et al. 2023): drop entries with probability ``1 - density``, rescale, weighted sum."""

from __future__ import annotations

from .elementwise import DENSITY, LAMBDA, NORMALIZE, RESCALE, SEED, SPACE, Elementwise
from .registry import register


@register
class DareLinear(Elementwise):
    """``sum_i w_i X_i * Bernoulli(d_i) / d_i``, the masks drawn per module from ``sha256(seed, module)``.

    Masks are drawn in float32 on the CPU whatever the device, so one seed gives the same masks
    everywhere, and PEFT's masks on float32 adapters when its global generator is seeded alike.
    With ``normalize: true`` (mergekit's option) the sum is divided by the sum of the weights.
    """

    name = "dare_linear"
    summary = "DARE: drop each entry with probability 1 - --density, rescale by 1/density, weighted sum (--seed)"
    fields = (DENSITY, SPACE, SEED, NORMALIZE, RESCALE, LAMBDA)
    drop = "random"
    combine = "sum"
