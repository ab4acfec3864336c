"""mergekit's spherical merges on a stack of vectors: NuSLERP's coefficients, Multi-SLERP, Karcher, Model Stock.

Each takes the models' updates as a stack ``X`` (n, ...) of tensors compared by the Frobenius inner
product, and uses only norms, inner products and linear combinations of them, so the same code runs
exactly on a module's cores ``C_i`` (``Qb C_i Qa^T``: the bases are orthonormal) as on the dense updates.
The definitions follow mergekit 0.1.5 (``merge_methods/nuslerp.py``, ``multislerp.py``, ``karcher.py``,
``model_stock.py``) step for step, float64, with their epsilons (named where used); Model Stock differs
where mergekit floors a product of norms at 1e-6 (an absolute floor that the small rows of a LoRA update
reach): here only a zero norm gives a cosine of 0.
"""

from __future__ import annotations

import torch

NUSLERP_EPS = 1e-8  # mergekit's nuslerp: colinear when 1 - cos^2 <= eps^2
NUSLERP_NORM_FLOOR = 1e-7  # mergekit's nuslerp normalizes by max(||v||, 1e-7)
STOCK_SINGULAR = 1e-6  # mergekit's model_stock: |1 + (N - 1) cos| below this keeps the base (t = 0)


def nuslerp_coefficients(n0: torch.Tensor, n1: torch.Tensor, inner: torch.Tensor, t: float):
    """``(c0, c1)`` with ``nuslerp(v0, v1, t) = c0 v0 + c1 v1``, elementwise over tensors of norms and inner products.

    ``cos = <v0, v1> / (max(n0, 1e-7) max(n1, 1e-7))`` clamped to [-1, 1]; ``c0 = sin((1 - t) theta) / sin theta``,
    ``c1 = sin(t theta) / sin theta``; ``(1 - t, t)`` where ``1 - cos^2 <= 1e-16`` (mergekit's nuslerp).

    Args:
        n0, n1 (Tensor): norms of the vectors. inner (Tensor): their inner products. t (float): 0 gives v0.
    """
    cos = (inner / (n0.clamp(min=NUSLERP_NORM_FLOOR) * n1.clamp(min=NUSLERP_NORM_FLOOR))).clamp(-1, 1)
    colinear = (1 - cos.square()) <= NUSLERP_EPS**2
    theta = torch.acos(torch.where(colinear, torch.zeros_like(cos), cos))
    s = torch.sin(theta)
    safe = torch.where(colinear, torch.ones_like(s), s)
    c0 = torch.where(colinear, torch.full_like(cos, 1 - t), torch.sin((1 - t) * theta) / safe)
    c1 = torch.where(colinear, torch.full_like(cos, t), torch.sin(t * theta) / safe)
    return c0, c1


def multislerp(X: torch.Tensor, w, normalize_weights: bool = True, eps: float = 1e-8) -> torch.Tensor:
    """Multi-SLERP (mergekit's ``multislerp``): barycentric interpolation on the sphere, scaled to the mean norm.

    With ``u_i = x_i / (||x_i|| + eps)``, ``m = sum_i w_i u_i / ||.||``, tangents ``g_i = u_i - <u_i, m> m`` and
    ``g = sum_i w_i g_i``: ``result = (sum_i w_i ||x_i||) (cos(|g|') m + sin(|g|') g / |g|')``, ``|g|' = ||g|| + eps``
    (weights normalized to sum 1 first with ``normalize_weights``). One vector is returned as it is; two whose
    weighted unit mean is below eps are averaged linearly; more raise ValueError (mergekit's).

    Args:
        X (Tensor): (n, ...) the vectors. w (sequence[float]): (n,) weights. normalize_weights (bool). eps (float).
    """
    if X.shape[0] == 1:
        return X[0]
    n = X.shape[0]
    flat = X.reshape(n, -1)
    wt = torch.as_tensor(list(w), dtype=X.dtype, device=X.device)
    if normalize_weights:
        wt = wt / wt.sum()
    norms = torch.linalg.vector_norm(flat, dim=1, keepdim=True)
    unit = flat / (norms + eps)
    mean = (unit * wt.view(-1, 1)).sum(0)
    mean_norm = torch.linalg.vector_norm(mean)
    if mean_norm < eps:
        if n == 2:
            return (X[0] * wt[0] + X[1] * wt[1]).reshape(X.shape[1:])
        raise ValueError("multislerp: the weighted mean of the unit updates is zero (antipodal updates with "
                         "balancing weights); use other weights")
    mean = mean / mean_norm
    tangent = unit - (unit * mean).sum(-1, keepdim=True) * mean
    g = (tangent * wt.view(-1, 1)).sum(0)
    gn = torch.linalg.vector_norm(g) + eps
    result = mean * torch.cos(gn) + g * (torch.sin(gn) / gn)
    return (result * (norms.squeeze(-1) * wt).sum()).reshape(X.shape[1:])


def karcher(X: torch.Tensor, alphas, max_iter: int = 10, tol: float = 1e-5) -> torch.Tensor:
    """The weighted Karcher mean on the unit sphere, scaled by ``sum_i a_i ||x_i||`` (mergekit's ``karcher``).

    Vectors of norm at most ``tol`` take no part in the mean (their ``a_i`` still scale it). From the
    normalized weighted mean of the unit vectors (or the first unit vector when that is below ``tol``), up to
    ``max_iter`` Riemannian gradient steps ``m <- cos(|g|) m + sin(|g|) g / |g|`` with
    ``g = sum_i a_i' theta_i / sin(theta_i) (u_i - cos(theta_i) m)`` over the units with ``theta_i >= tol``
    (``a'``: the weights normalized over the vectors taking part); stop when ``|g| < tol``. Every iterate is
    a combination of the inputs, so on cores it is exact.

    Args:
        X (Tensor): (n, ...) the vectors. alphas (sequence[float]): (n,) weights (mergekit: 1/n each).
        max_iter (int), tol (float): mergekit's ``max_iter`` and ``tol``.
    """
    if X.shape[0] == 1:
        return X[0]
    norms = [torch.linalg.vector_norm(x) for x in X]
    units = [x / nm if float(nm) != 0.0 else torch.zeros_like(x) for x, nm in zip(X, norms)]
    valid = [i for i, nm in enumerate(norms) if float(nm) > tol]
    if not valid:
        return torch.zeros_like(X[0])
    total = sum(alphas[i] for i in valid)
    a = [alphas[i] / total for i in valid]
    us = [units[i] for i in valid]
    mean = sum(ai * u for ai, u in zip(a, us))
    mn = torch.linalg.vector_norm(mean)
    mean = us[0].clone() if float(mn) < tol else mean / mn
    for _ in range(max_iter):
        g = torch.zeros_like(mean)
        for ai, u in zip(a, us):
            dot = torch.clamp((mean * u).sum(), -1.0, 1.0)
            theta = torch.arccos(dot)
            if float(theta) < tol:
                continue
            g = g + ai * (theta / torch.sin(theta)) * (u - dot * mean)
        gn = torch.linalg.vector_norm(g)
        if float(gn) < tol:
            break
        mean = torch.cos(gn) * mean + torch.sin(gn) * (g / gn)
        un = torch.linalg.vector_norm(mean)
        if float(un) > tol:
            mean = mean / un
    return sum(ai * nm for ai, nm in zip(alphas, norms)) * mean


def model_stock_ratio(gram: torch.Tensor) -> torch.Tensor:
    """Model Stock's interpolation ratio ``t = N cos / (1 + (N - 1) cos)`` (Jang et al. 2024, eq. 4; mergekit's).

    ``cos`` is the mean over pairs i < j of ``<x_i, x_j> / (||x_i|| ||x_j||)`` (0 where either norm is 0),
    clamped to [-1, 1]; ``t = 0`` where ``|1 + (N - 1) cos| < 1e-6`` (mergekit keeps the base there).

    Args:
        gram (Tensor): (N, N, ...) inner products ``<x_i, x_j>`` (per row or column for a filter-wise ratio).

    Returns:
        Tensor of shape ``gram.shape[2:]``.
    """
    n = gram.shape[0]
    diag = torch.stack([gram[i, i] for i in range(n)]).clamp(min=0).sqrt()
    coss = []
    for i in range(n):
        for j in range(i + 1, n):
            den = diag[i] * diag[j]
            c = torch.where(den > 0, gram[i, j] / torch.where(den > 0, den, torch.ones_like(den)),
                            torch.zeros_like(den))
            coss.append(c.clamp(-1, 1))
    cos = torch.stack(coss).mean(dim=0)
    den = 1 + (n - 1) * cos
    singular = den.abs() < STOCK_SINGULAR
    return torch.where(singular, torch.zeros_like(cos), n * cos / torch.where(singular, torch.ones_like(den), den))

