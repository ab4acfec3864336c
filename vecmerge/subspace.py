"""One shared basis per module: every update of a merge as a small core ``Qb @ C @ Qa.T``.

All the adapters a recipe names live, module by module, in the span of their stacked factors. One QR
of the stacked left factors (``Qb``, out x p) and one of the stacked right factors (``Qa``, in x q) per
module, and every expression over those adapters is exactly a (p x q) core::

    s B A = Qb (s Rb_i Ra_i^T) Qa^T          for every term i: its blocks of the two R factors

so sums, inner products, norms and SVDs of everything in the merge (base, direction, reference,
target, step) cost O(p q) to O(p q min(p, q)) instead of one QR of out x r per quantity.
Only lifting back to factors (``InSpan.svd``) touches out and in again, once, to write.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .lowrank import COMPUTE_DTYPE, SVD, LowRank, f64
from .lowrank import device as DEVICE


@dataclass(frozen=True)
class Subspace:
    """Orthonormal bases containing the column and row spaces of a module's terms.

    Args:
        Qb (Tensor): (out, p), orthonormal columns. Qa (Tensor): (in, q), orthonormal columns.
    """

    Qb: torch.Tensor
    Qa: torch.Tensor

    @classmethod
    def of(cls, terms: list[LowRank], shape: tuple[int, int]) -> tuple[Subspace, list[InSpan]]:
        """QR of ``[B_1 .. B_n]`` and ``[A_1^T .. A_n^T]``; returns the space and each term's core.

        Term i's core is ``s_i Rb[:, i] Ra[:, i]^T`` (its blocks of the two R factors): exact, no
        projection needed. Cost O((out + in) R^2) for R the summed ranks.
        """
        live = [t for t in terms if t.rank > 0]
        if not live:
            space = cls(torch.zeros(shape[0], 0, dtype=COMPUTE_DTYPE, device=DEVICE()),
                        torch.zeros(shape[1], 0, dtype=COMPUTE_DTYPE, device=DEVICE()))
            return space, [space.zero() for _ in terms]
        Qb, Rb = torch.linalg.qr(torch.cat([f64(t.B) for t in live], 1))
        Qa, Ra = torch.linalg.qr(torch.cat([f64(t.A).T for t in live], 1))
        space = cls(Qb, Qa)
        cores, col = [], 0
        for t in terms:
            if t.rank == 0:
                cores.append(space.zero())
                continue
            C = t.scale * (Rb[:, col:col + t.rank] @ Ra[:, col:col + t.rank].T)
            cores.append(InSpan(C, space, float(torch.linalg.matrix_norm(C))))
            col += t.rank
        return space, cores

    @property
    def shape(self) -> tuple[int, int]:
        return (int(self.Qb.shape[0]), int(self.Qa.shape[0]))

    def zero(self) -> InSpan:
        return InSpan(torch.zeros(self.Qb.shape[1], self.Qa.shape[1], dtype=self.Qb.dtype,
                                  device=self.Qb.device), self, 0.0)

    def left(self, X: torch.Tensor) -> torch.Tensor:
        """``Qb @ X`` for X (p, k) -> (out, k)."""
        return self.Qb @ X

    def right(self, Y: torch.Tensor) -> torch.Tensor:
        """``Y @ Qa^T`` for Y (k, q) -> (k, in)."""
        return Y @ self.Qa.T

    def core_of(self, X: torch.Tensor, Y: torch.Tensor) -> torch.Tensor:
        """``Qb^T X Y Qa`` (p, q) for any factored ``X Y`` (X (out, k), Y (k, in)), in the span or not."""
        return (self.Qb.T @ X) @ (Y @ self.Qa)


@dataclass(frozen=True)
class InSpan:
    """An update ``Qb @ C @ Qa.T`` of one module, with the algebra of ``LowRank`` on its core.

    Args:
        C (Tensor): (p, q) core. space (Subspace): the bases.
        floor (float): ``sum |c_i| ||C_i||`` over the terms it was built from: the scale of its
            round-off, so that an exact cancellation such as ``x - x`` has rank 0.
    """

    C: torch.Tensor
    space: Subspace
    floor: float = 0.0

    @property
    def shape(self) -> tuple[int, int]:
        return self.space.shape

    def __mul__(self, c: float) -> InSpan:
        return InSpan(self.C * float(c), self.space, abs(float(c)) * self.floor)

    __rmul__ = __mul__

    def __neg__(self) -> InSpan:
        return self * -1.0

    def __add__(self, other: InSpan) -> InSpan:
        return InSpan(self.C + other.C, self.space, self.floor + other.floor)

    def __sub__(self, other: InSpan) -> InSpan:
        return InSpan(self.C - other.C, self.space, self.floor + other.floor)

    def inner(self, other: InSpan) -> float:
        """``<x, y>_F = sum(C_x * C_y)`` (the bases are orthonormal)."""
        return float((self.C * other.C).sum())

    def norm(self) -> float:
        """``||x||_F = ||C||_F``."""
        return float(torch.linalg.matrix_norm(self.C))

    def singular_values(self) -> torch.Tensor:
        """Singular values of the update, descending (those of the core)."""
        return torch.linalg.svdvals(self.C).cpu()

    def svd(self) -> SVD:
        """Thin SVD, lifted: ``C = U S V^T`` gives ``(Qb U) S (V^T Qa^T)``. Cost O((out + in) p q)."""
        U, S, Vh = torch.linalg.svd(self.C, full_matrices=False)
        return SVD(self.space.left(U), S, self.space.right(Vh), max(self.floor, float(torch.linalg.norm(S))))

    def lowrank(self) -> LowRank:
        """The same update as factors ``(Qb C, Qa^T)`` (rank q), for code that wants a LowRank."""
        return LowRank(self.space.left(self.C), self.space.Qa.T, 1.0)
