"""``svc``: Singular Value Calibration ("When shared knowledge hurts: spectral over-accumulation in model
merging", 2026, arXiv 2602.05536; fusion_bench's ``singular_value_calibration``), exact on the cores.

The definition (fusion_bench ``docs/algorithms/singular_value_calibration.md``): the merged update of task
arithmetic ``D = lambda sum_i D_i = U S V^T``; each singular direction's response to model i,
``a_r^i = u_r^T D_i``, against the merge's own, ``a_r = u_r^T D = s_r v_r^T``, gives ``s_r^i = <a_r, a_r^i> /
||a_r^i||^2`` (over 1: the merge over-counts model i there); the calibration ``g_r = n / sum_i max(alpha, s_r^i)``
scales the singular values: ``U diag(g S) V^T``. A model with no response in direction r (``a_r^i = 0``)
counts as ``s_r^i = 0``. fusion_bench's loop-based code projects each model on its own singular vectors
instead of the merge's; the written definition is used here. On the cores: ``u_r = Qb u'_r``, so
``a_r^i = u'_r^T C_i Qa^T`` and every norm and inner product is that of the small ``C_i^T u'_r``.
"""

from __future__ import annotations

from .base import Field, Method
from .registry import register
from .spectral_common import SCALE, no_density, weighted_cores

SVC_ALPHA = Field("svc_alpha", "SVC: the floor of each model's projection coefficient; higher calibrates more "
                  "(fusion_bench's alpha, default 0.1)", default=0.1)


@register
class Svc(Method):
    """``U diag(g S) V^T`` of the task arithmetic merge, g from each model's response (see the module docstring)."""

    name = "svc"
    summary = ("SVC: task arithmetic, then each singular value of the merge scaled down where several models "
               "add up in its direction (--svc-alpha; exact, factored)")
    operands = ("models",)
    fields = (SVC_ALPHA, SCALE)

    def validate(self, recipe):
        return no_density(recipe, self.name)

    def module(self, x, params):
        import torch

        from ..linalg.spectral import nonzero_svd
        from ..linalg.subspace import InSpan

        cores = weighted_cores(x)
        merged = sum(cores) * params.get("lambda", 1.0)
        U, S, Vh = nonzero_svd(merged)
        space = x.models[0].space
        if S.numel() == 0:
            return space.zero()
        alpha = params.get("svc_alpha", 0.1)
        resp_merge = S[:, None] * Vh  # (k, q): a_r in Qa's coordinates
        coeffs = []
        for C in cores:
            a = U.T @ C  # (k, q): a_r^i
            sq = (a * a).sum(1)
            s_ri = torch.where(sq > 0, (resp_merge * a).sum(1) / torch.where(sq > 0, sq, torch.ones_like(sq)),
                               torch.zeros_like(sq))
            coeffs.append(torch.clamp(s_ri, min=alpha))
        g = len(cores) / torch.stack(coeffs).sum(0)
        floor = sum(abs(w) * m.floor for w, m in zip(x.weights, x.models))
        return InSpan((U * (g * S)) @ Vh, space, floor)
