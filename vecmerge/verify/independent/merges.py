"""The non-linear merges of verify's own path: one module's intended update from its models' updates.

``merged(method, m, xs, weights, densities, r)`` dispatches on the recipe's method (its recorded fields ``r``)
to the numpy definitions of ``elementwise`` (element-wise: on the module's dense updates in ``space: full``,
on their principal cores in ``space: core``) and ``spherical``, and KnOTS here:

- ``space: core`` (element-wise): ``U``, ``V`` the singular vectors of ``[X_1 .. X_n]`` and ``[X_1; ..; X_n]``
  with singular values above ``PRINCIPAL_RTOL`` of the largest (from the models' shared cores), the method on
  ``U^T X_i V`` and the result ``U Z V^T`` (the result does not depend on the signs of the singular vectors);
- KnOTS (Stoica et al. 2025): ``[X_1 .. X_n] = U S [V_1^T .. V_n^T]`` (non-zero part), ``R_i = S V_i^T``,
  ``U merge(R_1 .. R_n)`` with ``knots_merge`` linear (``sum w_i R_i``), PEFT's ties or dare_ties.

Random drops (``dare_*``, ``della*``, KnOTS' ``dare_ties``) re-draw the pipeline's masks from the recorded
``seed`` by ``draws.Stream`` (module m's stream from ``module_seed(seed, m)``): exact, not a property check.
"""

from __future__ import annotations

import numpy as np

from .draws import Stream, module_seed
from .elementwise import gta, peft, sce
from .references import Uncovered, shared_cores
from .spherical import karcher, model_stock, multislerp, nuslerp
from .stack import Stack, dense

PEFT_RULE = {"magnitude_prune": ("magnitude", "sum"), "ties": ("magnitude", "ties"),
             "dare_linear": ("random", "sum"), "dare_ties": ("random", "ties")}
GENERALIZED = {"breadcrumbs": ("outliers", "none"), "breadcrumbs_ties": ("outliers", "sum"),
               "della": ("della", "sum"), "della_linear": ("della", "none")}
ELEMENTWISE = (*PEFT_RULE, *GENERALIZED, "sce")
SPHERICAL = ("model_stock", "nuslerp", "multislerp", "karcher", "knots")
COVERED = ELEMENTWISE + SPHERICAL
PRINCIPAL_RTOL = 1e-12
KNOTS_RTOL = 1e-12


def randomized(method: str, r: dict) -> bool:
    """Whether the recipe draws random masks (re-drawn here from its seed)."""
    return method in ("dare_linear", "dare_ties", "della", "della_linear") or (
        method == "knots" and r.get("knots_merge", "ties") == "dare_ties")


def _nonzero(S: np.ndarray, rtol: float) -> int:
    return int((S > rtol * S[0]).sum()) if S.size and S[0] > 0 else 0


def _kernel(method: str, m: str, X: np.ndarray, w, ds, r: dict) -> np.ndarray:
    """The element-wise ``method`` on the tasks X (n, rows, cols) by the recipe's fields."""
    stream = Stream(module_seed(int(r.get("seed", 0)), m)) if randomized(method, r) else None
    lam = float(r.get("lambda", 1.0) if r.get("lambda") is not None else 1.0)
    if method == "sce":
        return sce(X, float(r.get("select_topk", 1.0)))
    if method in GENERALIZED:
        sparsify, consensus = GENERALIZED[method]
        p = {"sparsify": sparsify, "rescale": "l1" if r.get("rescale") else "none", "consensus": consensus,
             "normalize": bool(r.get("normalize")), "lam": lam, "gamma": float(r.get("gamma") or 0.0),
             "epsilon": float(r.get("epsilon") or 0.0)}
        return gta(X, w, ds, p, stream)
    drop, combine = PEFT_RULE[method]
    majority = r.get("majority", "total")
    if r.get("normalize") is None:  # PEFT's rule
        return peft(X, w, ds, drop, combine, majority, stream) * lam
    rescale = {None: "inverse" if drop == "random" else "none", True: "l1", False: "none"}[r.get("rescale")]
    p = {"sparsify": drop, "rescale": rescale, "normalize": bool(r["normalize"]), "lam": lam,
         "consensus": "none" if combine == "sum" else {"total": "sum", "frequency": "count"}[majority]}
    return gta(X, w, ds, p, stream)


def _elementwise(method: str, m: str, xs: list[Stack], w, ds, r: dict) -> Stack:
    if r.get("space", "full") == "full":
        return dense(_kernel(method, m, np.stack([x.dense() for x in xs]), w, ds, r))
    Qb, cores, Qa = shared_cores([(x.B, x.A) for x in xs])
    U, Sb, _ = np.linalg.svd(np.hstack(cores), full_matrices=False)
    _, Sa, Vt = np.linalg.svd(np.vstack(cores), full_matrices=False)
    U, V = U[:, :_nonzero(Sb, PRINCIPAL_RTOL)], Vt[:_nonzero(Sa, PRINCIPAL_RTOL)].T
    Z = _kernel(method, m, np.stack([U.T @ C @ V for C in cores]), w, ds, r)
    return Stack(Qb @ (U @ Z), (Qa @ V).T, float(np.linalg.norm(Z)))


def _knots(m: str, xs: list[Stack], w, ds, r: dict) -> Stack:
    Qb, cores, Qa = shared_cores([(x.B, x.A) for x in xs])
    q = cores[0].shape[1]
    u, s, vh = np.linalg.svd(np.hstack(cores), full_matrices=False)
    k = _nonzero(s, KNOTS_RTOL)
    if k == 0:
        return Stack.zero(xs[0].B.shape[0], xs[0].A.shape[1])
    R = np.stack([(s[:k, None] * vh[:k, i * q:(i + 1) * q]) @ Qa.T for i in range(len(xs))])
    how = r.get("knots_merge", "ties")
    if how == "linear":
        merged = (R * np.asarray(w, dtype=np.float64)[:, None, None]).sum(0)
    else:
        drop = "magnitude" if how == "ties" else "random"
        stream = Stream(module_seed(int(r.get("seed", 0)), m)) if drop == "random" else None
        merged = peft(R, w, ds, drop, "ties", "total", stream)
    return Stack(Qb @ u[:, :k], merged, float(np.linalg.norm(merged)))


def merged(method: str, m: str, xs: list[Stack], weights, densities, r: dict) -> Stack:
    """Module m's merged update of the models' updates ``xs`` (unweighted) by ``method`` and the recipe ``r``.

    Args:
        method (str): one of COVERED. m (str): the module (its random stream). xs (list[Stack]): the models.
        weights (list[float]), densities (list[float]): each model's. r (dict): the manifest's recipe.
    """
    if method in ELEMENTWISE:
        return _elementwise(method, m, xs, weights, densities, r)
    if method == "knots":
        return _knots(m, xs, weights, densities, r)
    if method == "model_stock":
        return model_stock(xs, bool(r.get("filter_wise")))
    if method == "nuslerp":
        return nuslerp(xs, weights, bool(r.get("nuslerp_flatten", True)), bool(r.get("nuslerp_row_wise")))
    if method == "multislerp":
        return multislerp(xs, weights, bool(r.get("normalize_weights", True)), float(r.get("eps", 1e-8)))
    if method == "karcher":
        return karcher(xs, int(r.get("max_iter", 10)), float(r.get("tol", 1e-5)))
    raise Uncovered(f"method {method}: no independent reference yet")
