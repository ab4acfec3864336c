"""How ``vecmerge extract`` cuts one module's difference ``D = W_tuned - W_base`` (LoRA layout, (out, in)).

``D`` is formed in float64; the range finder works on a float32 copy and the final ``B = Q^T D`` and
``||D||_F^2`` are float64 on D, so every cut's dropped energy ``||D||^2 - sum S_k^2`` is exact (small
matrices: a full float64 SVD). Policies (``rank_policy.RankPolicy.parse_extract``): ``N`` (the rank-N cut,
``randsvd.rank_k_cut``); ``energy:E`` (the smallest rank keeping E of ``||D||^2``, by doubling the sketch;
``minimal`` says when it is certified optimal); ``auto`` (the Gavish-Donoho hard threshold, Gavish and
Donoho 2014, r and sigma iterated to a fixed point from r = 0):

    tau = lambda(beta) sqrt(n) sigma,   sigma^2 = (||D||^2 - sum_{i<r} S_i^2) / ((m - r)(n - r))
    beta = m / n (m <= n),   lambda(beta) = sqrt(2 (beta + 1) + 8 beta / (beta + 1 + sqrt(beta^2 + 14 beta + 1)))

Singular values under ``1e-9 ||D||`` are never kept. The bounds behind ``energy`` and when ``auto`` suits a
fine-tune: docs/design/linalg.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..errors import RecipeError
from .lowrank import EXACT_RTOL
from .randsvd import MatrixOperator, TruncatedSVD, default_oversample, power_iters_for, rank_k_cut, use_full_svd
from .rank_policy import EXTRACT_KINDS, RankPolicy

F64 = torch.float64
START_RANK = 16
ENERGY_SLACK = 1e-12
AUTO_ITERATIONS = 50


@dataclass(frozen=True)
class ModuleCut:
    """One module's cut and how its rank was chosen.

    Args:
        svd (TruncatedSVD): U (out, k), S (k,), Vh (k, in) float64, with the exact total and dropped energy.
        rank_lower_bound (int): the optimal rank for the policy is at least this (= rank but for energy).
        power_iters (int): subspace iterations used (0 on the full path).
        sigma, threshold (float | None): auto only: the estimated noise level and the threshold tau.
    """

    svd: TruncatedSVD
    rank_lower_bound: int
    power_iters: int
    sigma: float | None = None
    threshold: float | None = None

    @property
    def rank(self) -> int:
        return self.svd.rank

    @property
    def minimal(self) -> bool:
        return self.rank_lower_bound == self.rank


def difference_operator(D: torch.Tensor, total: float) -> MatrixOperator:
    """D (float64) as an operator: float32 products for the range finder, float64 for float64 inputs."""
    D32 = D.to(torch.float32)
    return MatrixOperator((int(D.shape[0]), int(D.shape[1])),
                          matmul=lambda X: (D if X.dtype == F64 else D32) @ X,
                          rmatmul=lambda Y: (D.T if Y.dtype == F64 else D32.T) @ Y,
                          frob_sq=total, dtype=torch.float32, device=D.device)


def _cut(D: torch.Tensor, op_cache: list, k: int, total: float, seed: int) -> tuple[TruncatedSVD, int]:
    """``rank_k_cut`` of D, the randomized path on D's float32 operator (made once per module, kept in ``op_cache``)."""
    def sketch() -> MatrixOperator:
        if not op_cache:
            op_cache.append(difference_operator(D, total))
        return op_cache[0]

    return rank_k_cut(D, k, seed=seed, sketch=sketch)


def gavish_donoho(beta: float) -> float:
    """``lambda(beta)``: the optimal hard threshold over ``sqrt(n) sigma`` for known noise (beta = m/n <= 1)."""
    return math.sqrt(2 * (beta + 1) + 8 * beta / (beta + 1 + math.sqrt(beta * beta + 14 * beta + 1)))


def auto_rank(S: torch.Tensor, total: float, rows: int, cols: int) -> tuple[int, float, float]:
    """(rank, sigma, tau) of the auto rule for the leading singular values ``S`` of D (see the module docstring)."""
    m, n = min(rows, cols), max(rows, cols)
    lam = gavish_donoho(m / n)
    s2 = (S.to(F64) ** 2).tolist()
    cum = [0.0]
    for v in s2:
        cum.append(cum[-1] + v)
    floor = EXACT_RTOL * math.sqrt(total)
    r, seen = 0, set()
    for _ in range(AUTO_ITERATIONS):
        dof = (m - r) * (n - r)
        sigma = math.sqrt(max(total - cum[r], 0.0) / dof) if dof > 0 else 0.0
        tau = max(lam * math.sqrt(n) * sigma, floor)
        r_new = sum(1 for v in S.tolist() if v > tau)
        if r_new == r or r_new in seen:
            r = max(r, r_new)
            break
        seen.add(r)
        r = r_new
    return r, sigma, tau


def cut_module(D: torch.Tensor, policy: RankPolicy, seed: int = 0, total: float | None = None) -> ModuleCut:
    """The cut of one difference D (float64, (out, in)) under ``policy`` (see the module docstring).

    Args:
        D (Tensor): (out, in) float64. policy (RankPolicy): of ``EXTRACT_KINDS`` (``parse_extract``).
        seed (int): the sketch's seed. total (float | None): ``||D||_F^2`` if already known (else float64).
    """
    if policy.kind not in EXTRACT_KINDS:
        raise RecipeError([f"--rank {policy}: use a positive integer N, energy:E with 0 < E <= 1, or auto"], "extract")
    rows, cols = D.shape
    total = float((D * D).sum()) if total is None else total
    if not math.isfinite(total):
        raise RecipeError(["the difference has NaN/Inf entries; check both models"], "extract")
    cache: list = []
    if total == 0.0:  # an unchanged module: nothing to keep, whatever the policy
        z = D.new_zeros
        return ModuleCut(TruncatedSVD(z(rows, 0), z(0), z(0, cols), 0.0, 0.0, "full", 0.0), 0, 0)
    if policy.kind == "fixed":
        svd, q = _cut(D, cache, int(policy.value), total, seed)
        return ModuleCut(svd, svd.rank, q)
    kk, full = START_RANK, min(rows, cols)
    while True:
        kk = min(kk, full)
        last = kk == full or use_full_svd(rows, cols, kk)
        svd, q = _cut(D, cache, full if last else kk, total, seed)
        if policy.kind == "energy":
            target = (policy.value - ENERGY_SLACK) * total
            cum = torch.cumsum(svd.S**2, 0)
            k = int((cum < target).sum()) + 1
            if k <= svd.rank:
                res = max(total - float(cum[-1]), 0.0)
                lower = k if last else min(int((cum + res < target).sum()) + 1, k)
                return ModuleCut(_truncate(svd, k), lower, q)
        else:
            r, sigma, tau = auto_rank(svd.S, total, rows, cols)
            if r < svd.rank or last:
                return ModuleCut(_truncate(svd, r), r, q, sigma, tau)
        kk *= 2


def _truncate(s: TruncatedSVD, k: int) -> TruncatedSVD:
    """The first k directions of a cut, with the exact dropped energy ``total - sum_{i<k} S_i^2``."""
    S = s.S[:k]
    kept = float((S**2).sum())
    optimal = float((s.S[k:] ** 2).sum()) + (s.optimal_dropped_energy or 0.0) if s.method == "full" else None
    dropped = optimal if optimal is not None else max(s.total_energy - kept, 0.0)
    return TruncatedSVD(s.U[:, :k], S, s.Vh[:k], s.total_energy, dropped, s.method, optimal)


__all__ = ["ModuleCut", "cut_module", "auto_rank", "gavish_donoho", "power_iters_for", "default_oversample"]
