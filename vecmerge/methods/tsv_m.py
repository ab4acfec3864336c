"""``tsv_m``: Task Singular Vectors merging (Gargiulo et al., CVPR 2025, arXiv 2412.00081), exact on the cores.

The paper (Sec. 4, "TSV-M"): each task's update ``D_i = U_i S_i V_i^T`` keeps its top ``k`` singular triplets
(``k = min(out, in) / n``); the kept singular vectors side by side, ``U = [U_1,k .. U_n,k]`` and
``V = [V_1,k .. V_n,k]``, are decorrelated by their polar factors (the orthonormal matrices nearest to them,
``U_perp = P Q^T`` for ``U = P S Q^T``), and the merge is ``lambda * U_perp diag(S_1,k .. S_n,k) V_perp^T``.

On a module's cores: ``D_i = Qb C_i Qa^T`` gives ``U_i = Qb u_i`` from the SVD of ``C_i``, and
``polar(Qb M) = Qb polar(M)``: the result is ``Qb [polar(u) diag(s) polar(v)^T] Qa^T``, exact. A LoRA update has
rank far below ``min(out, in) / n``: each model keeps at most its non-zero triplets (``linalg/spectral.py``).
"""

from __future__ import annotations

from .base import Field, Method
from .registry import register
from .spectral_common import SCALE, no_density, weighted_cores

SV_REDUCTION = Field("sv_reduction", "TSV-M: share of min(out, in) singular triplets kept per model (default "
                     "1 / number of models, the paper's), at most the model's rank", low=0.0, high=1.0)


@register
class TsvM(Method):
    """``lambda * U_perp S V_perp^T`` of the models' top singular triplets (see the module docstring)."""

    name = "tsv_m"
    summary = ("TSV-M: each model's top singular vectors side by side, decorrelated by their polar factors, "
               "with their singular values (exact, factored)")
    operands = ("models",)
    fields = (SV_REDUCTION, SCALE)

    def validate(self, recipe):
        p = no_density(recipe, self.name)
        if recipe.params.get("sv_reduction") == 0.0:
            p.append("sv_reduction=0: a share in (0, 1] of the singular triplets, e.g. 0.25")
        return p

    def module(self, x, params):
        import torch

        from ..linalg.spectral import nonzero_svd, polar
        from ..linalg.subspace import InSpan

        n = len(x.models)
        red = params.get("sv_reduction") or 1.0 / n
        cap = int(min(x.models[0].shape) * red)
        us, ss, vs = [], [], []
        for C in weighted_cores(x):
            u, s, vh = nonzero_svd(C)
            k = min(cap, s.numel())
            us.append(u[:, :k])
            ss.append(s[:k])
            vs.append(vh[:k].T)
        space = x.models[0].space
        U, S, V = torch.cat(us, 1), torch.cat(ss), torch.cat(vs, 1)
        if S.numel() == 0:
            return space.zero()
        core = (polar(U) * S) @ polar(V).T
        floor = sum(abs(w) * m.floor for w, m in zip(x.weights, x.models))
        return InSpan(core * params.get("lambda", 1.0), space, floor)
