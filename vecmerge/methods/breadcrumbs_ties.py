"""``breadcrumbs_ties``: Model Breadcrumbs' sparsification, then TIES' sign consensus (mergekit 0.1.5's)."""

from __future__ import annotations

from .generalized import BREADCRUMBS_FIELDS, Generalized
from .registry import register


@register
class BreadcrumbsTies(Generalized):
    """Breadcrumbs' ``T_i``, then ``sum_i A_i w_i T_i`` (``/ sum_i A_i w_i`` with normalize), A_i the agreement of
    ``sign(w_i T_i)`` with the sign of ``sum_j w_j T_j`` (mergekit's election on the weighted tasks)."""

    name = "breadcrumbs_ties"
    summary = ("Model Breadcrumbs' sparsification (--density, --gamma), then the sign consensus of TIES on the "
               "weighted updates (mergekit's)")
    fields = BREADCRUMBS_FIELDS
    sparsify = "outliers"
    consensus = "sum"
