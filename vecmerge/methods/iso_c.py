"""``iso_c``: Isotropic merging in the common subspace (Marczak et al., ICML 2025, "No task left behind"), exact.

The paper (Sec. 4.1, Iso-C): the task arithmetic sum ``D = sum_i D_i = U S V^T`` with its spectrum flattened to
the mean singular value, ``lambda * mean(S) U V^T``. Its code averages all ``min(out, in)`` singular values;
a sum of LoRA updates has rank ``k`` far below that, and its zero singular values' vectors are arbitrary, so
here the mean and ``U V^T`` run over the ``k`` non-zero ones (the same for a full-rank sum). On the cores:
the SVD of ``sum_i w_i C_i``, lifted by the bases (``linalg/spectral.py``).
"""

from __future__ import annotations

from .base import Method
from .registry import register
from .spectral_common import SCALE, no_density, weighted_cores


@register
class IsoC(Method):
    """``lambda * mean(S) U V^T`` of the sum of the updates (see the module docstring)."""

    name = "iso_c"
    summary = "Iso-C: the sum of the updates with all its singular values set to their mean (exact, factored)"
    operands = ("models",)
    fields = (SCALE,)

    def validate(self, recipe):
        return no_density(recipe, self.name)

    def module(self, x, params):
        from ..linalg.spectral import nonzero_svd
        from ..linalg.subspace import InSpan

        U, S, Vh = nonzero_svd(sum(weighted_cores(x)))
        space = x.models[0].space
        if S.numel() == 0:
            return space.zero()
        floor = sum(abs(w) * m.floor for w, m in zip(x.weights, x.models))
        return InSpan((U @ Vh) * (float(S.mean()) * params.get("lambda", 1.0)), space, floor)
