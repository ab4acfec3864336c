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

import math
from dataclasses import dataclass

import torch

from .lowrank import COMPUTE_DTYPE, SVD, LowRank

KAPPA_MAX = 1e6  # lift through ``S R^-1`` only below this condition number of R (error ~ kappa * 1e-16)


def condition_bound(R: torch.Tensor) -> float:
    """``||R||_F ||R^-1||_F``, an upper bound on the 2-norm condition number of a triangular R (inf if singular).

    At most ``m`` times ``kappa_2(R)`` (R is m x m); one triangular inverse, O(m^3 / 3), a sixth of an SVD's time.

    Args:
        R (Tensor): (m, m) upper triangular.
    """
    if not bool((R.diagonal() != 0).all()):
        return math.inf
    eye = torch.eye(R.shape[0], dtype=R.dtype, device=R.device)
    inverse = torch.linalg.solve_triangular(R, eye, upper=True)
    bound = float(torch.linalg.matrix_norm(R) * torch.linalg.matrix_norm(inverse))
    return bound if math.isfinite(bound) else math.inf


class Subspace:
    """Orthonormal bases containing the column and row spaces of a module's terms.

    Only the R factors of the stacks are computed (``torch.linalg.qr(mode="r")``): the stacks are
    ``Sb = [B_1 .. B_n] = Qb Rb`` and ``Sa = [A_1^T .. A_n^T] = Qa Ra``. Lifting a core back to full
    size uses ``Qb X = Sb (Rb^-1 X)`` (a triangular solve on a small matrix, then one product with the
    stack), which never forms Qb: half the work of a second, Householder QR. That is exact up to
    ``kappa(R) * u`` (u = 1.1e-16), so it is used only while ``condition_bound`` (>= kappa) of Rb and Ra is
    at most ``KAPPA_MAX``;
    a worse-conditioned stack (nearly repeated factors, ``x - x``) forms the Householder bases from the
    same stack instead (``bases()``: the same R, so they match the cores bit for bit). ``release()``
    drops whatever full-size arrays a lift made, so a whole-model pipeline holds one module's at a time.

    Args:
        terms (list[LowRank]): the non-zero terms, in stacking order (their factors, as read).
        shape (tuple[int, int]): (out, in). p (int), q (int): basis widths.
        R (tuple[Tensor, Tensor] | None): (Rb (p, p_b), Ra (q, q_a)), the stacks' R factors.
        stacks (tuple[Tensor, Tensor] | None): (Sb, Sa) kept from the start when memory allows (else
            formed again from the terms when a lift needs them).
        device (torch.device | None): where the cores live (the terms' device; cpu when there are none).
    """

    def __init__(self, terms: list[LowRank], shape: tuple[int, int], p: int, q: int, R=None, stacks=None,
                 device=None):
        self._terms, self.shape, self.p, self.q = terms, (int(shape[0]), int(shape[1])), p, q
        self._R = R
        self._stacks_kept: tuple[torch.Tensor, torch.Tensor] | None = stacks
        self._stacks_now: tuple[torch.Tensor, torch.Tensor] | None = None
        self._q: tuple[torch.Tensor, torch.Tensor] | None = None
        self._implicit: bool | None = None
        self.device = terms[0].device if terms else torch.device(device or "cpu")

    @staticmethod
    def _stacks(terms: list[LowRank]) -> tuple[torch.Tensor, torch.Tensor]:
        """``([B_1 .. B_n], [A_1^T .. A_n^T])`` in float64: each factor converted as it is copied in (one pass)."""
        width = sum(t.rank for t in terms)
        out, inn = terms[0].shape
        Bs = torch.empty(out, width, dtype=COMPUTE_DTYPE, device=terms[0].device)
        As = torch.empty(inn, width, dtype=COMPUTE_DTYPE, device=terms[0].device)
        col = 0
        for t in terms:
            Bs[:, col:col + t.rank].copy_(t.B)
            As[:, col:col + t.rank].copy_(t.A.T)
            col += t.rank
        return Bs, As

    @classmethod
    def of(cls, terms: list[LowRank], shape: tuple[int, int],
           keep_bases: bool = False, device=None) -> tuple[Subspace, list[InSpan]]:
        """R factors of ``[B_1 .. B_n]`` and ``[A_1^T .. A_n^T]``; the space and each term's core.

        Term i's core is ``s_i Rb[:, i] Ra[:, i]^T`` (its blocks of the two R factors): exact, no
        projection needed. Cost O((out + in) R^2) for R the summed ranks. With ``keep_bases`` the
        stacks are kept for lifting (faster when memory allows); otherwise they are formed again then.
        ``device`` places an all-zero module (no live term); otherwise the terms' device is used.
        """
        live = [t for t in terms if t.rank > 0]
        if not live:
            space = cls([], shape, 0, 0, device=device)
            return space, [space.zero() for _ in terms]
        Bs, As = cls._stacks(live)
        Rb = torch.linalg.qr(Bs, mode="r").R
        Ra = torch.linalg.qr(As, mode="r").R
        space = cls(live, shape, Rb.shape[0], Ra.shape[0], R=(Rb, Ra), stacks=(Bs, As) if keep_bases else None)
        cores, col = [], 0
        for t in terms:
            if t.rank == 0:
                cores.append(space.zero())
                continue
            C = t.scale * (Rb[:, col:col + t.rank] @ Ra[:, col:col + t.rank].T)
            cores.append(InSpan(C, space, float(torch.linalg.matrix_norm(C))))
            col += t.rank
        return space, cores

    def stacks(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(Sb, Sa): the stacked factors, kept from the start or formed again (until ``release()``)."""
        if self._stacks_kept is not None:
            return self._stacks_kept
        if self._stacks_now is None:
            self._stacks_now = now = self._stacks(self._terms)
            return now
        return self._stacks_now

    def implicit(self) -> bool:
        """Whether lifting may go through ``S R^-1`` (square, well-conditioned R; see the class docstring)."""
        if self._implicit is None:
            ok = bool(self._terms)
            for R in self._R or ():
                if not ok or R.shape[0] != R.shape[1]:
                    ok = False
                    break
                ok = condition_bound(R) <= KAPPA_MAX
            self._implicit = ok
        return self._implicit

    def bases(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(Qb, Qa) formed explicitly (Householder, from the same stacks), kept until ``release()``."""
        if self._q is None:
            if not self._terms:
                q = (torch.zeros(self.shape[0], 0, dtype=COMPUTE_DTYPE, device=self.device),
                     torch.zeros(self.shape[1], 0, dtype=COMPUTE_DTYPE, device=self.device))
            else:
                Bs, As = self.stacks()
                q = (torch.linalg.qr(Bs).Q, torch.linalg.qr(As).Q)
            self._q = q
            return q
        return self._q

    def release(self) -> None:
        """Drop the full-size arrays a lift formed (stacks kept from the start stay)."""
        self._q = None
        self._stacks_now = None

    def zero(self) -> InSpan:
        return InSpan(torch.zeros(self.p, self.q, dtype=COMPUTE_DTYPE, device=self.device), self, 0.0)

    def left(self, X: torch.Tensor) -> torch.Tensor:
        """``Qb @ X`` for X (p, k) -> (out, k): ``Sb (Rb^-1 X)``, or the explicit basis."""
        if self.implicit():
            return self.stacks()[0] @ torch.linalg.solve_triangular(self._R[0], X, upper=True)
        return self.bases()[0] @ X

    def right(self, Y: torch.Tensor) -> torch.Tensor:
        """``Y @ Qa^T`` for Y (k, q) -> (k, in): ``(Sa (Ra^-1 Y^T))^T``, or the explicit basis."""
        if self.implicit():
            return (self.stacks()[1] @ torch.linalg.solve_triangular(self._R[1], Y.T, upper=True)).T
        return Y @ self.bases()[1].T

    def core_of_left(self, X: torch.Tensor) -> torch.Tensor:
        """``Qb^T X`` (p, k) for X (out, k): ``Rb^-T Sb^T X``, or the explicit basis."""
        if self.implicit():
            return torch.linalg.solve_triangular(self._R[0].T, self.stacks()[0].T @ X, upper=False)
        return self.bases()[0].T @ X

    def core_of_right(self, Y: torch.Tensor) -> torch.Tensor:
        """``Y Qa`` (k, q) for Y (k, in): ``Y Sa Ra^-1``, or the explicit basis."""
        if self.implicit():
            return torch.linalg.solve_triangular(self._R[1], Y @ self.stacks()[1], upper=True, left=False)
        return Y @ self.bases()[1]

    def core_of(self, X: torch.Tensor, Y: torch.Tensor) -> torch.Tensor:
        """``Qb^T X Y Qa`` (p, q) for any factored ``X Y`` (X (out, k), Y (k, in)), in the span or not."""
        return self.core_of_left(X) @ self.core_of_right(Y)


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
        eye = torch.eye(self.space.q, dtype=self.C.dtype, device=self.C.device)
        return LowRank(self.space.left(self.C), self.space.right(eye), 1.0)


@dataclass(frozen=True, eq=False)
class Apart:
    """An operand of a module kept out of its basis, known by the figures the consensus gate reads.

    The consensus reference of a stepped method that does not read it (``v54 - v54e2`` of the v58 step): its
    inputs would widen the basis (p = 4r where the step needs 3r, about 40% more QR, lifts and rounding)
    for nothing but one inner product and one norm. Both are exact in factored form: the norm from the
    reference's own R-only QR (``LowRank.norm``), the inner product with the direction in Gram form
    (``LowRank.inner``), measured once when the module's cores are made.

    Args:
        shape (tuple[int, int]): (out, in). value (float): ``||x||_F``. floor (float): the round-off scale
            (``consensus.roundoff_floor`` of its stacked factors). against (InSpan): the core it was measured
            against. product (float): ``<x, against>_F``.
    """

    shape: tuple
    value: float
    floor: float
    against: InSpan
    product: float

    def norm(self) -> float:
        return self.value

    def inner(self, other) -> float:
        """``<x, other>_F`` for the one core it was measured against (ValueError for any other)."""
        if other is not self.against:
            raise ValueError("Apart.inner: measured against another operand only")
        return self.product

