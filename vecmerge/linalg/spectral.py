"""The spectral merges' shared steps on a module's cores: SVDs of the non-zero part, polar factors.

Every update of a module is ``Qb C Qa^T`` with orthonormal bases (``subspace``), so the SVD of an update,
of a sum, or of updates side by side (``[D_1 .. D_n] = Qb [C_1 .. C_n] (I (x) Qa^T)``) is that of the small
core, lifted by the bases; the polar factor of ``Qb M`` is ``Qb polar(M)``. TSV-M, Iso-C, Iso-CTS, KnOTS
and SVC are written with these on the cores and never form a dense (out, in) matrix.

Low-rank updates have zero singular values whose singular vectors are arbitrary (any orthonormal
completion): the papers' code, written for full-rank task vectors, would carry those directions into
its orthogonalization or its mean. Here only the non-zero part is used: singular values above
``NONZERO_RTOL`` of the largest (the same rule as the principal bases of ``methods/elementwise.py``).
"""

from __future__ import annotations

import torch

NONZERO_RTOL = 1e-12  # singular values below this share of the largest carry no direction of the updates


def nonzero_svd(C: torch.Tensor, rtol: float = NONZERO_RTOL) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(U, S, Vh)``: the thin SVD of ``C`` restricted to singular values above ``rtol`` of the largest.

    Args:
        C (Tensor): (p, q). rtol (float): the relative threshold.

    Returns:
        U (p, k), S (k,), Vh (k, q); k = 0 for a zero matrix.
    """
    U, S, Vh = torch.linalg.svd(C, full_matrices=False)
    k = int((S > rtol * S[0]).sum()) if S.numel() and float(S[0]) > 0 else 0
    return U[:, :k], S[:k], Vh[:k]


def polar(M: torch.Tensor) -> torch.Tensor:
    """The orthonormal polar factor ``P Q^T`` of ``M = P S Q^T`` (the nearest matrix with orthonormal columns).

    Args:
        M (Tensor): (p, k) with k <= p.
    """
    P, _, Qh = torch.linalg.svd(M, full_matrices=False)
    return P @ Qh
