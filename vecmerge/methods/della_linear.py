"""``della_linear``: DELLA's MagPrune and rescale, then the weighted sum (mergekit 0.1.5's)."""

from __future__ import annotations

from .generalized import DELLA_FIELDS, Generalized, normalize_field
from .registry import register


@register
class DellaLinear(Generalized):
    """``lambda * sum_i w_i T_i`` (``/ sum_i w_i`` with normalize), ``T_i`` DELLA's dropped and rescaled update."""

    name = "della_linear"
    summary = ("DELLA's drops (--density, --epsilon, --seed) and rescale, then the weighted sum (mergekit's)")
    fields = DELLA_FIELDS + (normalize_field(False),)
    sparsify = "della"
    consensus = "none"
