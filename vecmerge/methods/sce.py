"""``sce``: SCE (Wan et al. 2024, FuseChat, arXiv 2408.07990): select, calculate, erase, as mergekit 0.1.5's."""

from __future__ import annotations

from .base import Field
from .elementwise import SPACE, Elementwise
from .registry import register

SELECT_TOPK = Field("select_topk", "SCE: share of the entries of largest variance across the models kept "
                    "(mergekit's default 1: all)", default=1.0, low=0.0, high=1.0)


@register
class Sce(Elementwise):
    """``sum_i A_i c_i T_i / max(sum_i A_i c_i, 1e-6)`` with ``T_i = X_i * M`` (M: the ``select_topk`` entries of
    largest variance across models), ``c_i ~ mean(T_i^2)`` and A_i TIES' agreement (``linalg/gta.sce_merge``).

    The weights come from the updates themselves, so the models take none (as mergekit's ``sce``).
    """

    name = "sce"
    summary = ("SCE: keep the entries that vary most across models (--select-topk), weight each model by its "
               "mean square, elect signs, average the agreeing entries (mergekit's)")
    fields = (SELECT_TOPK, SPACE)

    def validate(self, recipe):
        p = []
        if (recipe.params.get("select_topk") or 1.0) <= 0.0:
            p.append("select_topk=0: a share in (0, 1] of the entries to keep, e.g. 0.5")
        if any(e.get("weight", 1.0) != 1.0 for e in recipe.models or []):
            p.append("method=sce: weighs each model by its own mean square; drop the weights")
        if any(e.get("density") is not None for e in recipe.models or []):
            p.append("method=sce: takes select_topk, not density; drop it from models")
        if self.space_for(recipe.params) == "dense" and "rank" not in recipe.given:
            p.append(f"method={self.name} in space full: its dense result has full rank; pass rank (e.g. --rank "
                     "32), or use space core")
        return p

    def merge_tasks(self, t, x, params):
        from ..linalg.gta import sce_merge

        return sce_merge(t.rows, t.n, t.shape, params.get("select_topk", 1.0), rows_per_block=t.block,
                         device=t.device)
