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


class Subspace:
    """Orthonormal bases containing the column and row spaces of a module's terms.

    The cores come from the R factors alone (``torch.linalg.qr(mode="r")``); the bases ``Qb`` (out x p)
    and ``Qa`` (in x q) are formed only when something is lifted back to full size, and ``release()``
    drops them again, so a whole-model pipeline holds one module's bases at a time. Re-forming them
    runs the same Householder QR on the same stack, so they match the cores bit for bit.

    Args:
        terms (list[LowRank]): the non-zero terms, in stacking order (their factors, as read).
        shape (tuple[int, int]): (out, in). p (int), q (int): basis widths.
        device (torch.device | None): where the cores live (the terms' device; cpu when there are none).
    """

    def __init__(self, terms: list[LowRank], shape: tuple[int, int], p: int, q: int, bases=None, device=None):
        self._terms, self.shape, self.p, self.q = terms, (int(shape[0]), int(shape[1])), p, q
        self._q = bases
        self._pinned = bases is not None
        self.device = terms[0].device if terms else torch.device(device or "cpu")

    @staticmethod
    def _stacks(terms: list[LowRank]) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.cat([f64(t.B) for t in terms], 1), torch.cat([f64(t.A).T for t in terms], 1)

    @classmethod
    def of(cls, terms: list[LowRank], shape: tuple[int, int],
           keep_bases: bool = False, device=None) -> tuple[Subspace, list[InSpan]]:
        """QR of ``[B_1 .. B_n]`` and ``[A_1^T .. A_n^T]``; the space and each term's core.

        Term i's core is ``s_i Rb[:, i] Ra[:, i]^T`` (its blocks of the two R factors): exact, no
        projection needed. Cost O((out + in) R^2) for R the summed ranks. With ``keep_bases`` the
        bases are formed now and kept (faster when memory allows); otherwise only R is computed.
        ``device`` places an all-zero module (no live term); otherwise the terms' device is used.
        """
        live = [t for t in terms if t.rank > 0]
        if not live:
            space = cls([], shape, 0, 0, device=device)
            return space, [space.zero() for _ in terms]
        Bs, As = cls._stacks(live)
        if keep_bases:
            (Qb, Rb), (Qa, Ra) = torch.linalg.qr(Bs), torch.linalg.qr(As)
            space = cls(live, shape, Rb.shape[0], Ra.shape[0], (Qb, Qa))
        else:
            Rb = torch.linalg.qr(Bs, mode="r").R
            Ra = torch.linalg.qr(As, mode="r").R
            space = cls(live, shape, Rb.shape[0], Ra.shape[0])
        cores, col = [], 0
        for t in terms:
            if t.rank == 0:
                cores.append(space.zero())
                continue
            C = t.scale * (Rb[:, col:col + t.rank] @ Ra[:, col:col + t.rank].T)
            cores.append(InSpan(C, space, float(torch.linalg.matrix_norm(C))))
            col += t.rank
        return space, cores

    def bases(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(Qb, Qa), formed on first use and kept until ``release()``."""
        if self._q is None:
            if not self._terms:
                self._q = (torch.zeros(self.shape[0], 0, dtype=COMPUTE_DTYPE, device=self.device),
                           torch.zeros(self.shape[1], 0, dtype=COMPUTE_DTYPE, device=self.device))
            else:
                Bs, As = self._stacks(self._terms)
                self._q = (torch.linalg.qr(Bs).Q, torch.linalg.qr(As).Q)
        return self._q

    def release(self) -> None:
        """Drop the full-size bases (unless kept from the start); the next lift forms them again."""
        if not self._pinned:
            self._q = None

    def zero(self) -> InSpan:
        return InSpan(torch.zeros(self.p, self.q, dtype=COMPUTE_DTYPE, device=self.device), self, 0.0)

    def left(self, X: torch.Tensor) -> torch.Tensor:
        """``Qb @ X`` for X (p, k) -> (out, k)."""
        return self.bases()[0] @ X

    def right(self, Y: torch.Tensor) -> torch.Tensor:
        """``Y @ Qa^T`` for Y (k, q) -> (k, in)."""
        return Y @ self.bases()[1].T

    def core_of(self, X: torch.Tensor, Y: torch.Tensor) -> torch.Tensor:
        """``Qb^T X Y Qa`` (p, q) for any factored ``X Y`` (X (out, k), Y (k, in)), in the span or not."""
        Qb, Qa = self.bases()
        return (Qb.T @ X) @ (Y @ Qa)


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

    def dense(self) -> torch.Tensor:
        """The update as a dense (out, in) float64 matrix, ``(Qb C) Qa^T``: one module at a time, for the
        dense-space merge methods and tests."""
        return self.space.left(self.C) @ self.space.bases()[1].T

    def lowrank(self) -> LowRank:
        """The same update as factors ``(Qb C, Qa^T)`` (rank q), for code that wants a LowRank."""
        return LowRank(self.space.left(self.C), self.space.bases()[1].T, 1.0)
