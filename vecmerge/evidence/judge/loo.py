"""Leave-one-model-out calibration: does a fit of the target on proxies predict a model it has never seen?

Over the n models with the target and every proxy (means over current runs), ``Z = [1, P_1, .., P_k]``:

    beta = argmin ||Z beta - y||   (minimum norm; SVD of Z cut at s_i > n * eps * s_1)
    yhat_(i) = y_i - e_i / (1 - h_i),   e = y - Z beta,   h_i = sum_j U_ij^2   (refit where 1 - h_i < LEVERAGE_TOL)

Judged by Spearman ρ and Kendall τ_b of ``yhat_(.)`` against ``y`` (bootstrap intervals), pairwise accuracy,
RMSE and the target's noise ceiling. Verdict: "too few models" below ``min_models`` (8) or k + 3 models;
"ranks candidates" when the held-out ρ's lower bound >= ``min_spearman_low`` (0.5); else "disaster detector
only". The fit learns each proxy's sign; the target's direction only orders ``rank``'s output.
Why, and the bootstrap's caveat: docs/design/evidence.md.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from .. import EvidenceError
from ..ledger.ledger import Record
from ..stats.stats import runs_by_model
from .calibrate import (
    MIN_MODELS,
    MIN_SPEARMAN_LOW,
    VERDICTS,
    Calibration,
    noise_ceiling,
    pairwise_accuracy,
    rank_agreement,
    verdict,
)

LEVERAGE_TOL = 1e-9


def _design(X: np.ndarray) -> np.ndarray:
    return np.column_stack([np.ones(X.shape[0]), X])


def _kept_svd(Z: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``U, S, Vt`` of the thin SVD of Z cut to the singular values s_i > max(Z.shape) * eps * s_1 (none if s_1 = 0)."""
    U, S, Vt = np.linalg.svd(Z, full_matrices=False)
    keep = S > S[0] * max(Z.shape) * np.finfo(float).eps if S.size and S[0] > 0 else np.zeros(S.size, bool)
    return U[:, keep], S[keep], Vt[keep]


def least_squares(X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """``beta`` (k+1,): intercept then slopes of the minimum-norm least-squares fit of ``y`` on ``[1, X]``.

    Args:
        X (ndarray): (n, k) proxies. y (ndarray): (n,) target.
    """
    U, S, Vt = _kept_svd(_design(X))
    return Vt.T @ ((U.T @ y) / S)


def held_out_predictions(X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """``yhat_(i)`` for every model i: the least-squares fit on the others at ``X_i`` (module docstring).

    Args:
        X (ndarray): (n, k) proxies. y (ndarray): (n,) target.
    """
    from scipy.linalg import lstsq

    Z = _design(X)
    Ur = _kept_svd(Z)[0]
    h = (Ur**2).sum(axis=1)
    e = y - Ur @ (Ur.T @ y)
    out = np.empty_like(y)
    for i in range(len(y)):
        if 1.0 - h[i] >= LEVERAGE_TOL:
            out[i] = y[i] - e[i] / (1.0 - h[i])
        else:
            rest = np.arange(len(y)) != i
            beta = lstsq(Z[rest], y[rest], lapack_driver="gelsd")[0]
            out[i] = float(Z[i] @ beta)
    return out


def calibrate_loo(proxies: Mapping[str, Mapping[str, Sequence[float]]], target: Mapping[str, Sequence[float]], *,
                  target_name: str = "target", directions: Mapping[str, bool] | None = None,
                  min_models: int = MIN_MODELS, min_spearman_low: float = MIN_SPEARMAN_LOW,
                  confidence: float = 0.95, n_boot: int = 2000, seed: int = 0,
                  ceiling_draws: int = 2000) -> Calibration:
    """Leave-one-model-out calibration of ``proxies`` against ``target`` (module docstring).

    Args:
        proxies (Mapping[str, Mapping[str, Sequence[float]]]): proxy name -> model -> its runs.
        target (Mapping[str, Sequence[float]]): model -> its target runs.
        directions (Mapping[str, bool] | None): metric -> higher_is_better (the target's and the proxies').
        min_models (int), min_spearman_low (float), confidence (float), n_boot (int), seed (int): as ``calibrate``.
    """
    if min_models < 3:
        raise EvidenceError(f"min_models={min_models}: at least 3 models are needed for a rank correlation")
    if not proxies:
        raise EvidenceError("calibrate --loo: name at least one proxy")
    directions = directions or {}
    names = tuple(proxies)
    models = tuple(m for m in target if target.get(m) and all(proxies[p].get(m) for p in names))
    n, k = len(models), len(names)
    mean = lambda v: math.fsum(v) / len(v)  # noqa: E731
    y = np.array([mean(target[m]) for m in models])
    X = np.array([[mean(proxies[p][m]) for p in names] for m in models]).reshape(n, k)
    ceiling, ceiling_models = noise_ceiling({m: target[m] for m in models}, draws=ceiling_draws, seed=seed)
    reasons, pred, coef = [], None, None
    rho = rho_p = rho_ci = tau = tau_p = tau_ci = acc = rmse = None
    valid = pairs = 0
    if n >= k + 3:
        beta = least_squares(X, y)
        coef = {"intercept": float(beta[0]), **{p: float(b) for p, b in zip(names, beta[1:])}}
        pred = held_out_predictions(X, y)
        rmse = float(np.sqrt(np.mean((pred - y) ** 2)))
        acc, pairs = pairwise_accuracy(list(pred), list(y))
        rho, rho_p, rho_ci, tau, tau_p, tau_ci, valid = rank_agreement(pred, y, n_boot=n_boot, seed=seed,
                                                                      confidence=confidence)
        if rho is None:
            what = target_name if np.ptp(y) == 0 else "the held-out prediction"
            reasons.append(f"{what} is the same for every model")
        th = directions.get(target_name)
        for p in names:
            ph = directions.get(p)
            if ph is not None and th is not None and coef[p] != 0 and (coef[p] > 0) != (ph == th):
                reasons.append(f"the fit weighs {p} against its declared direction (slope {coef[p]:+.4g})")
    code, why = verdict(n, max(min_models, k + 3), rho, rho_ci, ceiling, min_spearman_low=min_spearman_low,
                        target=target_name, have=f"{target_name} and {', '.join(names)}",
                        rho_name="the held-out Spearman's",
                        negative="held-out predictions order the models against the target", reasons=reasons)
    return Calibration(
        proxies=names, target=target_name, models=models, target_means=tuple(float(v) for v in y),
        proxy_means={p: [float(v) for v in X[:, j]] for j, p in enumerate(names)},
        predictions=None if pred is None else tuple(float(v) for v in pred), coefficients=coef, spearman=rho,
        spearman_p=rho_p, spearman_ci=rho_ci, kendall=tau, kendall_p=tau_p, kendall_ci=tau_ci, boot_valid=valid,
        pairwise_accuracy=acc, pairs=pairs, rmse=rmse, noise_ceiling=ceiling, noise_ceiling_models=ceiling_models,
        target_higher_is_better=directions.get(target_name), min_models=min_models, min_spearman_low=min_spearman_low,
        confidence=confidence, n_boot=n_boot, seed=seed, verdict_code=code, verdict=VERDICTS[code],
        reasons=why, loo=True)


def calibrate_loo_records(records: Iterable[Record], proxies: Sequence[str], target: str, *,
                          directions: Mapping[str, bool] | None = None, exclude: Iterable[str] = (),
                          **options: Any) -> Calibration:
    """``calibrate_loo`` over ledger records: each model's whole runs of each proxy and of the target.

    Args:
        records (Iterable[Record]): current records (stale ones left out). exclude (Iterable[str]): models left out
            (the candidates ``rank`` is about to rank). options: passed to ``calibrate_loo``.
    """
    records, left_out = list(records), set(exclude)
    runs = {m: {k: v for k, v in runs_by_model(r for r in records if r.metric == m).items() if k not in left_out}
            for m in (*proxies, target)}
    return calibrate_loo({p: runs[p] for p in proxies}, runs[target], target_name=target, directions=directions,
                         **options)
