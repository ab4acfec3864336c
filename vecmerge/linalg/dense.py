"""One module's update held as a dense float64 matrix: what the dense-space merge methods produce.

Element-wise merges (TIES, DARE, magnitude pruning in ``space: full``) are defined on the entries of
each module's update ``DeltaW_m`` (out x in), so their result is a dense matrix of full rank; the
pipeline forms it one module at a time, cuts it with a randomized truncated SVD (``rankcut.cut``) and
releases it. ``Dense`` gives it the few operations ``InSpan`` and ``LowRank`` have (norm, inner
product, scaling) so that the pipeline and ``verify`` treat the three alike.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .lowrank import COMPUTE_DTYPE, LowRank, f64


@dataclass(frozen=True)
class Dense:
    """An update ``D`` (out, in) of one module, float64.

    Args:
        D (Tensor): (out, in) the update, in the LoRA layout (``scale * B @ A``).
    """

    D: torch.Tensor

    def __post_init__(self):
        if self.D.dtype != COMPUTE_DTYPE:
            object.__setattr__(self, "D", f64(self.D))

    @property
    def shape(self) -> tuple[int, int]:
        return (int(self.D.shape[0]), int(self.D.shape[1]))

    def __mul__(self, c: float) -> Dense:
        return Dense(self.D * float(c))

    __rmul__ = __mul__

    def norm(self) -> float:
        """``||D||_F``."""
        return float(torch.linalg.matrix_norm(self.D))

    def inner(self, other) -> float:
        """``<D, X>_F`` for X a Dense, a LowRank (``s sum((B^T D) * A)``) or a core in a module's basis
        (``sum((Qb^T D Qa) * C)``): no second dense matrix."""
        if isinstance(other, Dense):
            return float((self.D * other.D).sum())
        if hasattr(other, "space"):  # subspace.InSpan
            return float((self.in_basis(other.space) * other.C).sum())
        B, A = f64(other.B).to(self.D.device), f64(other.A).to(self.D.device)
        return float(other.scale * ((B.T @ self.D) * A).sum())

    def in_basis(self, space) -> torch.Tensor:
        """``Qb^T D Qa`` (p, q): D's projection on a module's shared basis (``subspace.Subspace``), with which
        ``<D, Qb C Qa^T> = sum((Qb^T D Qa) * C)`` for every core C of that basis."""
        Qb, Qa = space.bases()
        return (Qb.T @ self.D) @ Qa

    def distance(self, x: LowRank) -> float:
        """``||x - D||_F`` for factors x, from ``||x||^2 - 2 <x, D> + ||D||^2`` (Gram of x, no dense x).

        The three terms are formed in float64; where they cancel to below 1e-6 of ``||D||^2`` (x within
        0.1% of D) the difference is formed densely instead, so the result keeps its relative digits.
        """
        xn = x.norm()
        dn = self.norm()
        sq = xn * xn - 2.0 * self.inner(x) + dn * dn
        if sq > 1e-6 * dn * dn:
            return max(sq, 0.0) ** 0.5
        return float(torch.linalg.matrix_norm(x.dense().to(self.D.device) - self.D))

    def dense(self) -> torch.Tensor:
        """The matrix itself (the interface of ``LowRank.dense``)."""
        return self.D
