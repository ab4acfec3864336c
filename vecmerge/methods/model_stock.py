"""``model_stock``: Model Stock (Jang et al., ECCV 2024, arXiv 2403.19522) on the updates, as mergekit 0.1.5's.

With the base at the origin of the updates, mergekit's ``t * mean_i w_i + (1 - t) w_0`` is the update
``t * mean_i x_i``, ``t = N cos / (1 + (N - 1) cos)`` from the mean pairwise cosine of the updates
(``linalg/spherical.model_stock_ratio``). ``filter_wise: false`` takes one cosine per module from the cores
(exact, in the module's basis); ``true`` one per output row, from ``Qb C_i`` (exact, written as factors).
"""

from __future__ import annotations

from .base import Field, Method
from .registry import register
from .spherical_common import count_models, from_rows, no_weights, rows_of

FILTER_WISE = Field("filter_wise", "Model Stock: one ratio per output row instead of per module (mergekit's "
                    "default false)", kind="bool", default=False)


@register
class ModelStock(Method):
    """``t * mean_i x_i`` with Model Stock's ratio t (see the module docstring)."""

    name = "model_stock"
    summary = ("Model Stock: the mean update scaled by N cos / (1 + (N - 1) cos), cos the mean pairwise cosine "
               "(per module, or per row with --filter-wise; mergekit's)")
    operands = ("models",)
    fields = (FILTER_WISE,)

    def validate(self, recipe):
        return count_models(recipe, self.name, 2) + no_weights(recipe, self.name)

    def module(self, x, params):
        import torch

        from ..linalg.spherical import model_stock_ratio

        n = len(x.models)
        if not params.get("filter_wise"):
            C = torch.stack([m.C for m in x.models])
            gram = torch.einsum("ipq,jpq->ij", C, C)
            t = float(model_stock_ratio(gram))
            mean = x.models[0]
            for m in x.models[1:]:
                mean = mean + m
            return mean * (t / n)
        L = torch.stack(rows_of(x))  # (n, out, q): rows of the updates in Qa's coordinates
        ratios = model_stock_ratio(torch.einsum("iok,jok->ijo", L, L))
        return from_rows(x, ratios[:, None] * L.mean(dim=0))
