"""``della``: DELLA-merging (Deep et al. 2024, arXiv 2406.11617): MagPrune, then TIES' consensus (mergekit 0.1.5's)."""

from __future__ import annotations

from .generalized import DELLA_FIELDS, Generalized, normalize_field
from .registry import register


@register
class Della(Generalized):
    """``lambda * sum_i A_i w_i T_i / sum_i A_i w_i``: ``T_i = X_i * M_i`` (L1-rescaled with ``rescale``), each
    entry of row rank r (of c) kept with probability ``d - eps + 2 eps (r - 1) / (c - 1)``; A_i as in TIES on the
    weighted tasks. The paper rescales each kept entry by ``1 / p``; mergekit (and so vecmerge) by the L1 norm."""

    name = "della"
    summary = ("DELLA: drop entries at random, the larger ones less often (--density, --epsilon, --seed), "
               "rescale, then the sign consensus of TIES (mergekit's)")
    fields = DELLA_FIELDS + (normalize_field(True),)
    sparsify = "della"
    consensus = "sum"
