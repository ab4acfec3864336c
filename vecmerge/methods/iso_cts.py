"""``iso_cts``: Isotropic merging in common and task-specific subspaces (Marczak et al., ICML 2025), exact.

The paper (Sec. 4.2, Iso-CTS), with ``k`` the rank of the sum ``D = sum_i D_i`` (the code's ``min(out, in)``:
see ``iso_c``): the common subspace is ``D``'s top ``k_c`` singular triplets, ``k_c = k - n s`` with
``s = round((k - int(f k)) / n)`` directions per task (``f``: ``common_space_fraction``, 0.8); each task's
residual outside it, ``(I - U_c U_c^T) D_i``, gives its top ``s`` triplets (at most its non-zero ones). All the
singular vectors side by side are orthogonalized by their polar factors, and every kept singular value is
replaced by their mean: ``lambda * mean(S) polar(U) polar(V)^T``. On the cores, exact (``linalg/spectral.py``).
"""

from __future__ import annotations

from .base import Field, Method
from .registry import register
from .spectral_common import SCALE, no_density, weighted_cores

COMMON = Field("common_space_fraction", "Iso-CTS: share of the sum's rank given to the common subspace (the "
               "paper's default 0.8)", default=0.8, low=0.0, high=1.0)


def split(k: int, n: int, fraction: float) -> tuple[int, int]:
    """``(k_c, s)``: the common subspace's size and each task's, so that ``k_c + n s = k`` (the paper's code)."""
    common = int(k * fraction)
    s = round((k - common) / n)
    return k - n * s, s


@register
class IsoCts(Method):
    """``lambda * mean(S) polar(U) polar(V)^T`` over common and task-specific triplets (see the module docstring)."""

    name = "iso_cts"
    summary = ("Iso-CTS: the sum's top singular directions plus each model's own outside them, orthogonalized, "
               "all singular values set to their mean (exact, factored)")
    operands = ("models",)
    fields = (COMMON, SCALE)

    def validate(self, recipe):
        return no_density(recipe, self.name)

    def module(self, x, params):
        import torch

        from ..linalg.spectral import nonzero_svd, polar
        from ..linalg.subspace import InSpan

        cores = weighted_cores(x)
        U, S, Vh = nonzero_svd(sum(cores))
        space = x.models[0].space
        if S.numel() == 0:
            return space.zero()
        kc, s = split(S.numel(), len(cores), params.get("common_space_fraction", 0.8))
        Uc = U[:, :kc]
        us, ss, vs = [U[:, :kc]], [S[:kc]], [Vh[:kc].T]
        for C in cores:
            u, si, vh = nonzero_svd(C - Uc @ (Uc.T @ C))
            k = min(s, si.numel())
            us.append(u[:, :k])
            ss.append(si[:k])
            vs.append(vh[:k].T)
        mean = float(torch.cat(ss).mean())
        core = polar(torch.cat(us, 1)) @ polar(torch.cat(vs, 1)).T
        floor = sum(abs(w) * m.floor for w, m in zip(x.weights, x.models))
        return InSpan(core * (mean * params.get("lambda", 1.0)), space, floor)
