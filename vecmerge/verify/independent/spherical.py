"""mergekit 0.1.5's spherical merges and Model Stock on factored updates, in numpy, for ``independent.merges``.

Each is a combination ``sum_i a_i x_i`` of the updates with coefficients from their Gram ``G_ij = <x_i, x_j>``
(a combination's norm is ``sqrt(a^T G a)``), written as factors: exact. Per row (column): row (column) Grams.

- Model Stock (Jang et al. 2024): ``t mean_i x_i``, ``t = N cos / (1 + (N - 1) cos)``, cos the mean pairwise
  cosine (0 at a zero norm, clamped), t = 0 where ``|1 + (N-1) cos| < 1e-6``; per row with ``filter_wise``.
- NuSLERP: ``t = w_1 / (w_0 + w_1)`` (0.5 below 1e-6), ``cos = <x0, x1> / (max(|x0|, 1e-7) max(|x1|, 1e-7))``,
  ``(1 - t, t)`` where ``1 - cos^2 <= 1e-16``, else ``sin((1-t) theta) / sin theta``, ``sin(t theta) / sin
  theta``; per module, row, or column (``row_wise``).
- Multi-SLERP: ``u_i = x_i / (|x_i| + eps)``, m the normalized ``sum w_i u_i``, ``g = sum_i w_i (u_i - <u_i,
  m> m)``, ``(sum_i w_i |x_i|) (cos(|g|+eps) m + sin(|g|+eps) g / (|g|+eps))``.
- Karcher (weights 1/n): the Riemannian mean of the unit updates, up to ``max_iter`` gradient steps (stop at
  ``|g| < tol``), times ``sum_i |x_i| / n``.
"""

from __future__ import annotations

import math

import numpy as np

from .references import Uncovered
from .stack import Stack

STOCK_SINGULAR = 1e-6
NUSLERP_EPS = 1e-8
NUSLERP_FLOOR = 1e-7
TOTAL_EPS = 1e-6


def gram(xs: list[Stack]) -> np.ndarray:
    """``G_ij = <x_i, x_j>_F``."""
    return np.array([[a.inner(b) for b in xs] for a in xs])


def combination(xs: list[Stack], a) -> Stack:
    """``sum_i a_i x_i`` as stacked factors."""
    out = Stack.zero(xs[0].B.shape[0], xs[0].A.shape[1])
    for x, c in zip(xs, a):
        out = out + x.scaled(float(c))
    return out


def _qnorm(G: np.ndarray, a: np.ndarray) -> float:
    return math.sqrt(max(float(a @ G @ a), 0.0))


def stock_ratio(G: np.ndarray) -> np.ndarray:
    """Model Stock's t from Grams ``G`` (N, N, ...) (per row for a filter-wise ratio)."""
    n = G.shape[0]
    diag = [np.sqrt(np.maximum(G[i, i], 0.0)) for i in range(n)]
    coss = []
    for i in range(n):
        for j in range(i + 1, n):
            den = diag[i] * diag[j]
            coss.append(np.clip(np.where(den > 0, G[i, j] / np.where(den > 0, den, 1.0), 0.0), -1, 1))
    cos = np.mean(coss, axis=0)
    den = 1 + (n - 1) * cos
    return np.where(np.abs(den) < STOCK_SINGULAR, 0.0, n * cos / np.where(np.abs(den) < STOCK_SINGULAR, 1.0, den))


def model_stock(xs: list[Stack], filter_wise: bool) -> Stack:
    """Model Stock of the updates ``xs`` (see the module docstring)."""
    n = len(xs)
    if not filter_wise:
        return combination(xs, [float(stock_ratio(gram(xs))) / n] * n)
    G = np.array([[np.einsum("or,rs,os->o", a.B, a.A @ b.A.T, b.B) for b in xs] for a in xs])
    t = stock_ratio(G) / n
    return combination([Stack(t[:, None] * x.B, x.A, x.bound * float(np.max(np.abs(t), initial=0.0)))
                        for x in xs], [1.0] * n)


def nuslerp_t(weights) -> float:
    total = weights[0] + weights[1]
    return 0.5 if abs(total) < TOTAL_EPS else weights[1] / total


def nuslerp_coefficients(n0, n1, inner, t: float):
    """NuSLERP's ``(c0, c1)`` elementwise over arrays of norms and inner products."""
    cos = np.clip(inner / (np.maximum(n0, NUSLERP_FLOOR) * np.maximum(n1, NUSLERP_FLOOR)), -1, 1)
    colinear = (1 - cos ** 2) <= NUSLERP_EPS ** 2
    theta = np.arccos(np.where(colinear, 0.0, cos))
    s = np.where(colinear, 1.0, np.sin(theta))
    return (np.where(colinear, 1 - t, np.sin((1 - t) * theta) / s), np.where(colinear, t, np.sin(t * theta) / s))


def nuslerp(xs: list[Stack], weights, flatten: bool, row_wise: bool) -> Stack:
    """NuSLERP of two updates (see the module docstring)."""
    a, b = xs
    t = nuslerp_t(weights)
    if flatten:
        c0, c1 = nuslerp_coefficients(np.array(a.norm()), np.array(b.norm()), np.array(a.inner(b)), t)
        return combination(xs, [float(c0), float(c1)])
    if row_wise:  # per column j: x[:, j] = B A[:, j]
        def col(x, y):
            return np.einsum("rj,rs,sj->j", x.A, x.B.T @ y.B, y.A)
        c0, c1 = nuslerp_coefficients(np.sqrt(np.maximum(col(a, a), 0)), np.sqrt(np.maximum(col(b, b), 0)),
                                      col(a, b), t)
        return Stack(np.hstack([a.B, b.B]), np.vstack([a.A * c0, b.A * c1]), a.bound + b.bound)

    def row(x, y):
        return np.einsum("or,rs,os->o", x.B, x.A @ y.A.T, y.B)
    c0, c1 = nuslerp_coefficients(np.sqrt(np.maximum(row(a, a), 0)), np.sqrt(np.maximum(row(b, b), 0)),
                                  row(a, b), t)
    return Stack(np.hstack([a.B * c0[:, None], b.B * c1[:, None]]), np.vstack([a.A, b.A]), a.bound + b.bound)


def multislerp(xs: list[Stack], weights, normalize_weights: bool, eps: float) -> Stack:
    """Multi-SLERP of the updates (see the module docstring)."""
    n = len(xs)
    if n == 1:
        return xs[0]
    G = gram(xs)
    w = np.asarray(weights, dtype=np.float64)
    if normalize_weights:
        w = w / w.sum()
    norms = np.sqrt(np.maximum(np.diag(G), 0.0))
    inv = 1.0 / (norms + eps)                      # u_i = inv_i x_i
    mean = w * inv
    mn = _qnorm(G, mean)
    if mn < eps:
        if n == 2:
            return combination(xs, w)
        raise Uncovered("multislerp: the weighted mean of the unit updates is zero (the pipeline refuses it)")
    mean = mean / mn
    dots = inv * (G @ mean)                        # <u_i, m>
    g = w * inv - (w * dots).sum() * mean          # sum_i w_i (u_i - <u_i, m> m)
    gn = _qnorm(G, g) + eps
    return combination(xs, (mean * math.cos(gn) + g * (math.sin(gn) / gn)) * float((norms * w).sum()))


def karcher(xs: list[Stack], max_iter: int, tol: float) -> Stack:
    """The Karcher mean of the updates, weights 1/n (see the module docstring)."""
    n = len(xs)
    if n == 1:
        return xs[0]
    G = gram(xs)
    norms = np.sqrt(np.maximum(np.diag(G), 0.0))
    alphas = np.full(n, 1.0 / n)
    units = [np.eye(n)[i] / norms[i] if norms[i] != 0 else np.zeros(n) for i in range(n)]
    valid = [i for i in range(n) if norms[i] > tol]
    if not valid:
        return combination(xs, np.zeros(n))
    a = [alphas[i] / sum(alphas[j] for j in valid) for i in valid]
    us = [units[i] for i in valid]
    mean = sum(ai * u for ai, u in zip(a, us))
    mn = _qnorm(G, mean)
    mean = us[0].copy() if mn < tol else mean / mn
    for _ in range(max_iter):
        g = np.zeros(n)
        for ai, u in zip(a, us):
            dot = min(max(float(mean @ G @ u), -1.0), 1.0)
            theta = math.acos(dot)
            if theta < tol:
                continue
            g = g + ai * (theta / math.sin(theta)) * (u - dot * mean)
        gn = _qnorm(G, g)
        if gn < tol:
            break
        mean = math.cos(gn) * mean + math.sin(gn) * (g / gn)
        un = _qnorm(G, mean)
        if un > tol:
            mean = mean / un
    return combination(xs, mean * float((alphas * norms).sum()))
