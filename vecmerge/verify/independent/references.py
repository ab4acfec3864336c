"""The spectral merges by their papers' definitions, in numpy, for ``independent.derive``: never the methods' code.

Each definition is the papers' dense one applied to the models' weighted updates ``D_i = w_i DeltaW_i``. All of
them are built from SVDs, polar factors, sums and inner products, which an orthonormal change of basis carries
over exactly: with ``Q_b`` and ``Q_a`` orthonormal bases of the span of every model's ``B`` and ``A^T``
(numpy QR), ``D_i = Q_b C_i Q_a^T`` and ``f(D_1..D_n) = Q_b f(C_1..C_n) Q_a^T`` for cores ``C_i`` of size
R x R (R the summed rank). Singular values below ``NONZERO_RTOL`` of the largest are not part of a spectrum.

- TSV-M (Gargiulo et al., CVPR 2025): each model's top ``cap = int(min(out, in) * sv_reduction)`` triplets
  (``sv_reduction`` default 1/n), side by side; ``lambda * polar(U) diag(S) polar(V)^T``.
- Iso-C (Marczak et al., ICML 2025): ``lambda * mean(S) U V^T`` of the sum's non-zero spectrum.
- Iso-CTS (same paper): the sum's top ``k_c`` directions (``k_c = k - n s``, ``s = round((k - int(k f)) / n)``)
  and each model's top ``s`` outside them; ``lambda * mean(all S) polar(U) polar(V)^T``.
- SVC (fusion_bench's singular value calibration): the sum ``M = lambda sum_i D_i = U S V^T`` with each
  ``sigma_r`` scaled by ``n / sum_i max(alpha, <a_r, a_r^i> / ||a_r^i||^2)``, ``a_r = sigma_r v_r``,
  ``a_r^i = u_r^T D_i``.
"""

from __future__ import annotations

import numpy as np

NONZERO_RTOL = 1e-10
UNIQUE_RTOL = 1e-8      # a polar factor is unique only when its matrix has full column rank
SPECTRAL = ("tsv_m", "iso_c", "iso_cts", "svc")


class Uncovered(Exception):
    """The recipe or an input is outside what verify's own derivation covers (with the reason)."""


def _svd_nz(M: np.ndarray):
    U, S, Vt = np.linalg.svd(M, full_matrices=False)
    k = int((S > NONZERO_RTOL * S[0]).sum()) if S.size and S[0] > 0 else 0
    return U[:, :k], S[:k], Vt[:k]


def _polar(M: np.ndarray) -> np.ndarray:
    """``P Q^T`` of ``M = P S Q^T``; Uncovered when M's columns are dependent (then any completion is a polar
    factor: the models share singular directions exactly, and the merge is not one update but many)."""
    P, S, Qt = np.linalg.svd(M, full_matrices=False)
    if S.size and S[-1] <= UNIQUE_RTOL * S[0]:
        raise Uncovered("the models' singular vectors are linearly dependent in a module, so the merge's polar "
                        "factor is not unique (inputs that share directions exactly)")
    return P @ Qt


def shared_cores(terms: list) -> tuple[np.ndarray, list, np.ndarray]:
    """``(Q_b, [C_i], Q_a)`` of factor pairs ``[(B_i, A_i)]``: ``B_i A_i = Q_b C_i Q_a^T`` exactly."""
    Qb = np.linalg.qr(np.hstack([B for B, _ in terms]))[0]
    Qa = np.linalg.qr(np.vstack([A for _, A in terms]).T)[0]
    return Qb, [(Qb.T @ B) @ (A @ Qa) for B, A in terms], Qa


def spectral(method: str, cores: list, shape: tuple, params: dict) -> np.ndarray:
    """The merged core of ``method`` over the weighted cores (see the module docstring for each formula).

    Args:
        method (str): one of SPECTRAL. cores (list[np.ndarray]): ``C_i`` (R x R), weights applied.
        shape (tuple): the module's (out, in) (TSV-M's cap counts the full matrix). params (dict): the recipe.
    """
    lam = 1.0 if params.get("lambda") is None else float(params["lambda"])
    n, R = len(cores), cores[0].shape
    if method == "tsv_m":
        red = params.get("sv_reduction") or 1.0 / n
        cap = int(min(shape) * red)
        parts = [_svd_nz(C) for C in cores]
        U = np.concatenate([u[:, :cap] for u, _, _ in parts], 1)
        S = np.concatenate([s[:cap] for _, s, _ in parts])
        Vt = np.concatenate([vt[:cap] for _, _, vt in parts], 0)
        return np.zeros(R) if not S.size else lam * (_polar(U) * S) @ _polar(Vt.T).T
    U, S, Vt = _svd_nz(sum(cores) * (lam if method == "svc" else 1.0))
    if not S.size:
        return np.zeros(R)
    if method == "iso_c":
        return lam * S.mean() * U @ Vt
    if method == "iso_cts":
        k = S.size
        s = round((k - int(k * params.get("common_space_fraction", 0.8))) / n)
        kc = k - n * s
        Uc = U[:, :kc]
        us, ss, vs = [Uc], [S[:kc]], [Vt[:kc]]
        for C in cores:
            u, si, vt = _svd_nz(C - Uc @ (Uc.T @ C))
            us.append(u[:, :s])
            ss.append(si[:s])
            vs.append(vt[:s])
        mean = np.concatenate(ss).mean()
        return lam * mean * _polar(np.concatenate(us, 1)) @ _polar(np.concatenate(vs, 0).T).T
    alpha = params.get("svc_alpha", 0.1)
    g = np.empty_like(S)
    for r in range(S.size):
        a = S[r] * Vt[r]
        terms = []
        for C in cores:
            ai = U[:, r] @ C
            sq = float(ai @ ai)
            terms.append(max(alpha, float(a @ ai) / sq if sq > 0 else 0.0))
        g[r] = n / sum(terms)
    return (U * (g * S)) @ Vt
