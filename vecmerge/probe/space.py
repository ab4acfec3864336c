"""Models as points: their log-likelihood vectors, the distances between them, a 2-D map, informative items.

Each model a has a vector ``L_a = (loglik_a,1 .. loglik_a,n)`` over the prompt file's n items (Oyama et al.,
ACL 2025, map 1,000+ models by such vectors: their squared distances track the KL between the models). Here:

    distance    d(a, b) = sqrt((1/n) sum_i (L_a,i - L_b,i)^2)         (nats per item, RMS)
    map         the rows of X = L - 1 mean_models(L) (each item centered over the models, which leaves every
                distance unchanged), projected on X's first two principal axes: X = U S V^T, coords = U_:2 S_:2
                (classical multidimensional scaling of d; each axis signed so that its largest coordinate is
                positive); ``explained``: S_k^2 / sum S^2
    informative the items the models disagree on most: the mean over pairs of the item's JS divergence
                (arXiv 2310.14424 picks prompts by such per-prompt divergences), and the spread of its loglik
"""

from __future__ import annotations

import numpy as np


def loglik_matrix(models: dict[str, dict], ids: list[str]) -> np.ndarray:
    """(M, n) float64: ``models[name]["items"][id]["loglik"]`` in model and item order."""
    return np.array([[models[m]["items"][i]["loglik"] for i in ids] for m in models], dtype=np.float64)


def distances(L: np.ndarray) -> np.ndarray:
    """(M, M) RMS per-item differences of the rows of ``L`` (module docstring)."""
    diff = L[:, None, :] - L[None, :, :]
    return np.sqrt((diff**2).mean(axis=-1))


def coordinates(L: np.ndarray) -> tuple[np.ndarray, list[float]]:
    """(M, 2) map coordinates of the rows of ``L`` and the share of the spread each axis explains."""
    X = L - L.mean(axis=0, keepdims=True)
    U, S, _ = np.linalg.svd(X, full_matrices=False)
    k = min(2, S.size)
    coords = np.zeros((L.shape[0], 2))
    coords[:, :k] = U[:, :k] * S[:k]
    for j in range(k):
        if coords[np.argmax(np.abs(coords[:, j])), j] < 0:
            coords[:, j] = -coords[:, j]
    total = float((S**2).sum())
    explained = [float(S[j] ** 2 / total) if total > 0 and j < k else 0.0 for j in range(2)]
    return coords, explained


def function_map(models: dict[str, dict], ids: list[str], pairs: list[dict], *, top: int = 10) -> dict:
    """``{"models", "coords", "explained", "distance", "informative"}`` of a probe's results (JSON-ready).

    Args:
        models (dict[str, dict]): name -> {"items": {id: {"loglik", ...}}}. ids (list[str]): the items, in order.
        pairs (list[dict]): ``{"a", "b", "items": {id: {"js", ...}}}`` per pair (may be empty).
        top (int): how many informative items to list.
    """
    names = list(models)
    L = loglik_matrix(models, ids)
    coords, explained = coordinates(L)
    d = distances(L)
    spread = L.std(axis=0) if len(names) > 1 else np.zeros(len(ids))
    js = {i: float(np.mean([p["items"][i]["js"] for p in pairs])) for i in ids} if pairs else {}
    at = {i: k for k, i in enumerate(ids)}
    order = sorted(ids, key=lambda i: (-js.get(i, 0.0), -float(spread[at[i]]), i))
    return {"models": names, "coords": {m: [float(x) for x in coords[k]] for k, m in enumerate(names)},
            "explained": explained, "distance": {a: {b: float(d[x, y]) for y, b in enumerate(names)}
                                                 for x, a in enumerate(names)},
            "informative": [{"item": i, "mean_js": js.get(i), "loglik_spread": float(spread[at[i]])}
                            for i in order[:top]]}
