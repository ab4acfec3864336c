"""The element-wise merges on dense tasks, in numpy, for ``independent.merges``: never ``linalg``'s kernels.

Each takes tasks ``X`` (n, rows, cols) (dense updates or principal cores) and returns the merged (rows, cols).
Entries rank by ``|x|``, ties to the lowest row-major index (``top``); masks come from ``draws.Stream``.

- PEFT's rule (``peft``: ``ties``, ``dare_*`` without ``normalize``, ``magnitude_prune``): the top ``int(d N)``
  by magnitude, or random ``p = d`` divided by d; ``sum_i w_i T_i``, or TIES (Yadav et al. 2023): the sign of
  the UNweighted ``sum T_i`` (``sum sign T_i``: frequency), ``sum_i A_i w_i T_i / max(1, sum_i A_i)``.
- mergekit 0.1.5's generalized task arithmetic (``gta``): magnitude ``max(1, int(d N))``; outliers (breadcrumbs)
  the ``int(d N)`` after the ``int(gamma N)`` largest; random; DELLA's per-row ``p = d - eps + 2 eps (r-1)/(c-1)``
  (stable ranks); rescale 1/d, L1 (1 below 1e-7) or none; ``Y_i = w_i T_i``; consensus none, ``sum Y`` or
  ``sum sign Y``; divisor ``sum w`` (1 below 1e-8) or ``sum_i A_i w_i`` (1 at 0); ``normalize``; times lambda.
- SCE (Wan et al. 2024, mergekit's): the ``int(nnz(var) topk)`` entries of largest variance across tasks,
  ``c_i`` ~ ``mean(T_i^2)`` (uniform at 0), ``sum_i A_i c_i T_i / max(sum_i A_i c_i, 1e-6)``.
"""

from __future__ import annotations

import numpy as np

from .draws import Stream

L1_EPS = 1e-7
DIVISOR_EPS = 1e-8
SCE_CLAMP = 1e-6


BLOCK_BYTES = 64 * 2**20  # float64 bytes of every task's rows combined at once


def top(a: np.ndarray, k: int) -> np.ndarray:
    """Bool mask of the k largest entries of ``a`` (any shape), ties by the lowest row-major index first: the
    entries above the k-th largest value t, then as many entries equal to t as are missing, in index order."""
    flat = a.reshape(-1)
    n = flat.size
    if k >= n or k <= 0:
        return np.full(a.shape, k > 0)
    t = np.partition(flat, n - k)[n - k]
    mask = flat > t
    need = k - int(np.count_nonzero(mask))
    if need > 0:
        mask[np.flatnonzero(flat == t)[:need]] = True
    return mask.reshape(a.shape)


def _blocks(X: np.ndarray):
    """Row blocks ``(r0, r1)`` of the tasks X (n, rows, cols) of about BLOCK_BYTES together."""
    step = max(1, BLOCK_BYTES // max(1, 8 * X.shape[0] * X.shape[2]))
    return [(r0, min(X.shape[1], r0 + step)) for r0 in range(0, X.shape[1], step)]


def _draw(stream: Stream | None, p: np.ndarray) -> np.ndarray:
    if stream is None:
        raise ValueError("a random drop needs the module's stream (the recipe's seed)")
    return stream.bernoulli(p)


def _sign_vote(v: np.ndarray) -> np.ndarray:
    return np.where(v >= 0, 1.0, -1.0)


def peft(X: np.ndarray, w, ds, drop: str, combine: str, majority: str, stream: Stream | None) -> np.ndarray:
    """PEFT's magnitude_prune / ties / dare_linear / dare_ties (see the module docstring).

    Args:
        X (np.ndarray): (n, rows, cols). w, ds (sequence[float]): weights and densities, one per task.
        drop (str): magnitude | random. combine (str): sum | ties. majority (str): total | frequency.
        stream (Stream | None): the module's random stream (random drops).
    """
    T = X.copy()  # trimmed task by task, then combined a block of rows at a time (memory: X, T and the output)
    for i, d in enumerate(ds):
        if d >= 1.0:
            continue
        if drop == "random":
            T[i] *= _draw(stream, np.full(X[i].shape, d, dtype=np.float32))
            T[i] /= d
        elif int(d * X[i].size) < X[i].size:
            T[i] *= top(np.abs(X[i]), int(d * X[i].size))
    wv = np.asarray(w, dtype=np.float64)[:, None, None]
    out = np.empty(T.shape[1:])
    for r0, r1 in _blocks(T):
        t = T[:, r0:r1]
        if combine == "sum":
            out[r0:r1] = (t * wv).sum(0)
            continue
        s = _sign_vote(t.sum(0) if majority == "total" else np.sign(t).sum(0))
        agree = np.sign(t) == s
        out[r0:r1] = (t * wv * agree).sum(0) / np.maximum(agree.sum(0), 1.0)
    return out


def della_probabilities(x: np.ndarray, d: float, eps: float) -> np.ndarray:
    """DELLA's float32 keep probabilities per row (rank 1: the smallest ``|x|``; stable ranks)."""
    ranks = np.argsort(np.argsort(np.abs(x), axis=1, kind="stable"), axis=1, kind="stable").astype(np.float32) + 1
    cols = x.shape[1]
    norm = (np.clip((ranks - np.float32(1)) / np.float32(cols - 1), 0, 1) if cols > 1
            else np.zeros_like(ranks))
    return np.float32(d - eps) + norm * np.float32(2) * np.float32(eps)


def gta(X: np.ndarray, w, ds, p: dict, stream: Stream | None) -> np.ndarray:
    """mergekit's generalized task arithmetic (see the module docstring).

    Args:
        X (np.ndarray): (n, rows, cols). w, ds (sequence[float]): one per task.
        p (dict): sparsify (none|magnitude|random|outliers|della), rescale (none|l1|inverse), consensus
            (none|sum|count), normalize (bool), lam, gamma, epsilon. stream (Stream | None): random drops.
    """
    T = X.copy()  # sparsified task by task, then combined a block of rows at a time
    for i, d in enumerate(ds):
        if p["sparsify"] == "none" or d >= 1.0:
            continue
        a, n = np.abs(X[i]), X[i].size
        if p["sparsify"] == "magnitude":
            mask = top(a, max(1, int(d * n)))
        elif p["sparsify"] == "outliers":
            keep = int(d * n)
            n_bot = max(0, n - keep - int(p["gamma"] * n))
            mask = top(a, n - n_bot) & ~top(a, n - n_bot - keep)
        elif p["sparsify"] == "random":
            mask = _draw(stream, np.full(X[i].shape, d, dtype=np.float32))
        else:
            mask = _draw(stream, della_probabilities(X[i], d, p["epsilon"]))
        f = 1.0
        if p["rescale"] == "inverse":
            f = 1.0 / d
        elif p["rescale"] == "l1":
            before, after = float(a.sum()), float((a * mask).sum())
            f = 1.0 if before < L1_EPS or after < L1_EPS else before / after
        T[i] *= mask
        if f != 1.0:
            T[i] *= f
    wv = np.asarray(w, dtype=np.float64)
    out = np.empty(T.shape[1:])
    for r0, r1 in _blocks(T):
        Y = T[:, r0:r1] * wv[:, None, None]
        divisor: float | np.ndarray
        if p["consensus"] == "none":
            mixed, total = Y.sum(0), float(wv.sum())
            divisor = 1.0 if abs(total) < DIVISOR_EPS else total
        else:
            s = _sign_vote(Y.sum(0) if p["consensus"] == "sum" else np.sign(Y).sum(0))
            agree = np.sign(Y) == s
            mixed = (Y * agree).sum(0)
            divisor = (wv[:, None, None] * agree).sum(0)
            divisor = np.where(divisor == 0, 1.0, divisor)
        if p["normalize"]:
            mixed = mixed / divisor
        out[r0:r1] = mixed * p["lam"]
    return out


def sce(X: np.ndarray, select_topk: float) -> np.ndarray:
    """SCE: select by variance across tasks, weigh by mean square, erase disagreeing signs."""
    n = X.shape[0]
    T = X
    if select_topk < 1.0:
        var = X.var(axis=0)
        T = X * top(var, int(np.count_nonzero(var) * select_topk))
    c = (T ** 2).sum(axis=(1, 2)) / T[0].size
    c = c / c.sum() if float(c.sum()) > 0 else np.full(n, 1.0 / n)
    agree = np.sign(T) == _sign_vote(T.sum(0))
    ew = c[:, None, None] * agree
    return (T * ew).sum(0) / np.maximum(ew.sum(0), SCE_CLAMP)
