"""``breadcrumbs``: Model Breadcrumbs (Davari & Belilovsky 2023, arXiv 2312.06795), as mergekit 0.1.5 defines it."""

from __future__ import annotations

from .generalized import BREADCRUMBS_FIELDS, Generalized
from .registry import register


@register
class Breadcrumbs(Generalized):
    """``lambda * sum_i w_i T_i`` (``/ sum_i w_i`` with normalize): T_i model i's entries ranked by magnitude, the
    smallest and the ``gamma`` share of largest dropped so that a ``density`` share is kept."""

    name = "breadcrumbs"
    summary = ("Model Breadcrumbs: drop each model's smallest entries and its --gamma largest (outliers), keep "
               "--density, then the weighted sum (mergekit's)")
    fields = BREADCRUMBS_FIELDS
    sparsify = "outliers"
    consensus = "none"
