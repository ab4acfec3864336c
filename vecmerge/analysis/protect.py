"""Protected steps: a direction projected off the protected inputs' span, exact on one factor (DESIGN.md section 8).

With ``G = sum_k X_k^T X_k`` (the protected inputs of one module, float64) and ``U`` its top eigenvectors holding the
share ``E`` of its trace, the module's direction ``D = s B A`` becomes::

    D' = s B (A - (A U) U^T)        (the same rank; D' x = 0 for every x in span U)

In the pipeline ``D = Qb C Qa^T`` (a core in the module's shared basis): the right basis is widened by the part of
``U`` outside it (``ProtectedSpace``), so that ``D' = Qb C (I - W W^T) Qa2^T`` with ``W = Qa2^T U`` is again a core.
The figures are quadratic forms ``||D X^T||_F^2 = tr(C Qa2^T G Qa2 C^T)`` in the same core.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..errors import NumericError
from ..linalg.lowrank import COMPUTE_DTYPE
from ..linalg.subspace import InSpan, Subspace

ENERGY_DEFAULT = 0.9
ZERO_EIG = 1e-12  # eigenvalues below this share of the largest are round-off, never protected
OUTSIDE = 1e-8  # a part of U outside the basis below this norm is round-off (its effect on D' x is ~ its square)


def energy_basis(G: torch.Tensor, energy: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(U, eigenvalues)``: the fewest top eigenvectors of ``G`` whose eigenvalues sum to at least ``energy`` of its
    trace, ``sum_{i<c} w_i >= E * sum_i w_i`` (w descending), and every eigenvalue, descending.

    Eigenvalues below ``ZERO_EIG`` of the largest count as zero (round-off), so ``c`` never exceeds the inputs'
    numerical rank. NumericError when ``G`` is zero (no protected input reached the module).

    Args:
        G (Tensor): (in, in) symmetric positive semi-definite, float64. energy (float): E in (0, 1].
    """
    return energy_cut(*decompose_gram(G), energy)


def decompose_gram(G: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(w, V)``: ``G = V diag(w) V^T`` by float64 eigh, w descending.

    Args:
        G (Tensor): (in, in) symmetric positive semi-definite.
    """
    w, V = torch.linalg.eigh(G.to(COMPUTE_DTYPE))
    return w.flip(0), V.flip(1)


def decompose_factor(F: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(w, V)`` of ``G = F^T F`` without forming it: ``F = P diag(s) V^T`` (float64 SVD), ``w = s^2`` descending.

    Exact: ``F^T F``'s eigenvectors are ``F``'s right singular vectors, and the SVD keeps the small ones more
    accurately than an eigh of the formed Gram.

    Args:
        F (Tensor): (n, in) rows (any n; n below in gives at most n eigenvalues).
    """
    F = F.to(COMPUTE_DTYPE)
    if F.shape[0] < F.shape[1]:  # LAPACK is several times faster on the tall orientation: F^T = V diag(s) P^T
        V, S, _ = torch.linalg.svd(F.T, full_matrices=False)
        return S * S, V
    _, S, Vh = torch.linalg.svd(F, full_matrices=False)
    return S * S, Vh.T


def energy_cut(w: torch.Tensor, V: torch.Tensor, energy: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(U, w)``: ``V``'s first ``c`` columns, ``c`` the fewest whose ``w`` (descending) hold ``energy`` of the sum,
    eigenvalues below ``ZERO_EIG`` of the largest counted as zero. NumericError when every ``w`` is zero.

    Args:
        w (Tensor): (k,) eigenvalues, descending. V (Tensor): (in, k) eigenvectors. energy (float): E in (0, 1].
    """
    top = float(w[0]) if w.numel() else 0.0
    if not top > 0.0 or not math.isfinite(top):
        raise NumericError("the protected inputs' Gram is zero (or not finite)")
    w = torch.where(w > ZERO_EIG * top, w, torch.zeros_like(w))
    return V[:, :energy_count(w, energy)].contiguous(), w


def energy_count(w: torch.Tensor, energy: float) -> int:
    """``c``: the fewest of the eigenvalues ``w`` (descending, round-off already zeroed) whose sum is at least
    ``energy`` of their total, and never more than the non-zero ones (``energy_basis``'s rule, for a caller that
    keeps one eigendecomposition for several energies)."""
    cum = torch.cumsum(w, 0)
    total = float(cum[-1])
    c = int(torch.searchsorted(cum, torch.tensor([energy * total * (1 - 1e-12)], dtype=cum.dtype)).item()) + 1
    return min(c, int((w > 0).sum()))


class ProtectedSpace(Subspace):
    """A module's shared basis with its right (input-side) basis widened by orthonormal columns ``extra``.

    ``Qb`` is the parent's; ``Qa2 = [Qa, extra]`` (``extra`` orthogonal to ``Qa``). Every lift and core of the
    parent works unchanged on the first ``q`` columns.

    Args:
        parent (Subspace): the module's basis. extra (Tensor): (in, k) orthonormal, orthogonal to its ``Qa``.
    """

    def __init__(self, parent: Subspace, extra: torch.Tensor):
        super().__init__([], parent.shape, parent.p, parent.q + extra.shape[1], device=parent.device)
        self.parent, self.extra, self.q0 = parent, extra, parent.q

    def implicit(self) -> bool:
        return False

    def bases(self) -> tuple[torch.Tensor, torch.Tensor]:
        Qb, Qa = self.parent.bases()
        return Qb, torch.cat([Qa, self.extra], 1)

    def release(self) -> None:
        self.parent.release()

    def left(self, X: torch.Tensor) -> torch.Tensor:
        return self.parent.left(X)

    def core_of_left(self, X: torch.Tensor) -> torch.Tensor:
        return self.parent.core_of_left(X)

    def right(self, Y: torch.Tensor) -> torch.Tensor:
        return self.parent.right(Y[:, :self.q0]) + Y[:, self.q0:] @ self.extra.T

    def core_of_right(self, Y: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.parent.core_of_right(Y), Y @ self.extra], 1)


def _outside(space: Subspace, U: torch.Tensor) -> torch.Tensor:
    """Orthonormal columns spanning the part of ``U`` outside ``span Qa`` (projected out twice; round-off dropped)."""
    R = U
    for _ in range(2):
        R = R - space.right(space.core_of_right(R.T)).T if space.q else R
    if R.shape[1] == 0:
        return R
    Q, S, _ = torch.linalg.svd(R, full_matrices=False)
    return Q[:, S > OUTSIDE].contiguous()


def widen(x: InSpan, space: ProtectedSpace) -> InSpan:
    """``x`` in the widened basis: its core padded with zero columns (the same update)."""
    pad = torch.zeros(x.C.shape[0], space.q - x.C.shape[1], dtype=x.C.dtype, device=x.C.device)
    return InSpan(torch.cat([x.C, pad], 1), space, x.floor)


@dataclass(frozen=True)
class Projected:
    """One module's protection: the widened space, the projected direction, ``W = Qa2^T U`` and the rank of U.

    Args:
        space (ProtectedSpace). direction (InSpan): ``D'`` in it. W (Tensor): (q2, c). rank (int): c.
    """

    space: ProtectedSpace
    direction: InSpan
    W: torch.Tensor
    rank: int


def project(d: InSpan, U: torch.Tensor) -> Projected:
    """``D' = D - (D U) U^T`` on the core: ``C' = C - (C W) W^T`` with ``W = Qa2^T U`` in the widened basis.

    Args:
        d (InSpan): the module's direction ``D`` (after its mode, consensus and multiplier). U (Tensor): (in, c)
            orthonormal columns (``energy_basis``).
    """
    U = U.to(device=d.C.device, dtype=COMPUTE_DTYPE)
    space = ProtectedSpace(d.space, _outside(d.space, U))
    W = space.core_of_right(U.T).T
    C = widen(d, space).C
    return Projected(space, InSpan(C - (C @ W) @ W.T, space, d.floor), W, U.shape[1])


def quadratic(x: InSpan, G: torch.Tensor) -> float:
    """``||x X^T||_F^2 = tr(x G x^T)`` for ``G = X^T X`` (in, in): ``sum((C M) * C)``, ``M = Qa^T G Qa``.

    Args:
        x (InSpan): an update (out, in) as a core. G (Tensor): (in, in) float64.
    """
    sp = x.space
    GQ = sp.core_of_right(G.to(device=x.C.device, dtype=COMPUTE_DTYPE))  # G Qa (in, q)
    M = sp.core_of_right(GQ.T)  # Qa^T G Qa (q, q)
    return float(((x.C @ M) * x.C).sum())


def quadratic_rows(x: InSpan, F: torch.Tensor) -> float:
    """``||x F^T||_F^2 = tr(x F^T F x^T)`` from rows ``F`` (n, in): ``||C (F Qa)^T||^2``, no Gram formed.

    Args:
        x (InSpan): an update (out, in) as a core. F (Tensor): (n, in) rows (or a sketch's).
    """
    P = x.space.core_of_right(F.to(device=x.C.device, dtype=COMPUTE_DTYPE))  # F Qa (n, q)
    return float(((P @ x.C.T) ** 2).sum())


def ratio(kept: float, whole: float) -> float | None:
    """``sqrt(kept / whole)``: the share of a (squared) norm that remains (None when ``whole`` is zero)."""
    return math.sqrt(max(kept, 0.0) / whole) if whole > 0.0 else None
