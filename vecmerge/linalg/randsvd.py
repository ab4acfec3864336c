"""Truncated SVD by a randomized range finder, with the EXACT energy it drops.

``truncated_svd(D, k)`` (D dense or given by its products) runs Halko, Martinsson and Tropp (2011), Alg. 4.4:
``Q = qr(D @ Omega)``, then ``q`` times ``Q = qr(D @ qr(D^T @ Q))``, a seeded Gaussian sketch of k + oversample
columns in the working precision; then ``B = Q^T D`` in float64 (column blocks), ``B = Ub S Vh``, ``U = Q Ub``:

    ||D - U_k S_k Vh_k||_F^2 = ||D||_F^2 - sum_{i<k} S_i^2        (computed from D, not estimated)

Small matrices (``min(rows, cols) <= 4 * (k + oversample)``) take a full float64 SVD instead
(``use_full_svd``). ``rank_k_cut`` is the one rank-k cut of a dense matrix: ``POWER_ITERS`` (2) power
iterations while ``8 k <= min(rows, cols)``, one more above (``power_iters_for``).
The precisions and the measurements behind the rule: docs/design/linalg.md.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..errors import SVDInputError
from .lowrank import LowRank

F64 = torch.float64
BLOCK_BYTES = 64 * 2**20  # float64 column block of D converted at a time
ENERGY_SLACK = 1e-12  # a share of the total: "reaches E" means captured >= (E - slack) * total
POWER_ITERS = 2  # power iterations of a rank-k cut up to rank min(rows, cols) / 8, one more above


@dataclass(frozen=True)
class MatrixOperator:
    """A matrix ``D`` (rows, cols) known by its products, e.g. a factored or streamed difference.

    Args:
        shape (tuple[int, int]): (rows, cols).
        matmul (callable): X (cols, l) -> ``D @ X`` (rows, l).
        rmatmul (callable): Y (rows, l) -> ``D.T @ Y`` (cols, l). The final projection ``B = Q^T D``
            calls it with a float64 Y: it should compute in float64 for the dropped energy to be exact.
        frob_sq (float | None): ``||D||_F^2`` if known exactly; otherwise it is computed as
            ``sum ||D @ I[:, block]||^2`` (as costly as forming D once).
    """

    shape: tuple[int, int]
    matmul: Callable[[torch.Tensor], torch.Tensor]
    rmatmul: Callable[[torch.Tensor], torch.Tensor]
    frob_sq: float | None = None
    dtype: torch.dtype = F64
    device: torch.device = torch.device("cpu")


@dataclass(frozen=True)
class TruncatedSVD:
    """A rank-k cut ``U diag(S) Vh`` of D with its exact error.

    Args:
        U (Tensor): (rows, k), orthonormal columns, float64. S (Tensor): (k,), descending. Vh (Tensor): (k, cols).
        total_energy (float): ``||D||_F^2`` computed from D.
        dropped_energy (float): ``||D - U diag(S) Vh||_F^2 = total - sum S^2`` (>= 0).
        method (str): ``"randomized"`` or ``"full"``.
        optimal_dropped_energy (float | None): ``sum_{i>=k} sigma_i(D)^2`` where known (the full path).
    """

    U: torch.Tensor
    S: torch.Tensor
    Vh: torch.Tensor
    total_energy: float
    dropped_energy: float
    method: str
    optimal_dropped_energy: float | None = None

    @property
    def rank(self) -> int:
        return int(self.S.shape[0])

    @property
    def error(self) -> float:
        """Frobenius error of the cut, ``sqrt(dropped_energy)``."""
        return self.dropped_energy**0.5

    @property
    def relative_error(self) -> float:
        """``||D - cut|| / ||D||`` (0 for a zero D)."""
        return (self.dropped_energy / self.total_energy) ** 0.5 if self.total_energy > 0 else 0.0

    @property
    def captured_share(self) -> float:
        """``sum S^2 / ||D||^2`` (1 for a zero D)."""
        return 1.0 - self.dropped_energy / self.total_energy if self.total_energy > 0 else 1.0

    def lowrank(self) -> LowRank:
        """The cut as factors split evenly: ``B = U sqrt(S)``, ``A = sqrt(S) Vh``, scale 1."""
        root = torch.sqrt(self.S)
        return LowRank(self.U * root, root[:, None] * self.Vh, 1.0)


def default_oversample(k: int) -> int:
    """Sketch columns beyond k: ``max(10, k // 2)`` (a flat noise tail needs more than HMT's usual 10)."""
    return max(10, k // 2)


def use_full_svd(rows: int, cols: int, k: int, oversample: int | None = None) -> bool:
    """The small-matrix rule: a full SVD when ``min(rows, cols) <= 4 * (k + oversample)``."""
    p = default_oversample(k) if oversample is None else oversample
    return min(rows, cols) <= 4 * (k + p)


def frobenius_sq(D: torch.Tensor | MatrixOperator) -> float:
    """``||D||_F^2`` accumulated in float64 (column blocks; for an operator, its ``frob_sq`` or ``D @ I`` blocks)."""
    if isinstance(D, MatrixOperator):
        if D.frob_sq is not None:
            return float(D.frob_sq)
        rows, cols = D.shape
        total, step = 0.0, max(1, BLOCK_BYTES // (8 * max(rows, 1)))
        for j in range(0, cols, step):
            eye = torch.eye(cols, dtype=D.dtype, device=D.device)[:, j:j + step]
            total += float((D.matmul(eye).to(F64) ** 2).sum())
        return total
    return _project(D, None)[1]


def optimal_dropped_energy(D: torch.Tensor, k: int) -> float:
    """``sum_{i>=k} sigma_i(D)^2`` from the full float64 spectrum (Eckart-Young): for tests and benchmarks."""
    S = torch.linalg.svdvals(D.to(F64))
    return float((S[k:] ** 2).sum())


def _check(D, k: int | None = None) -> tuple[int, int]:
    if isinstance(D, MatrixOperator):
        shape = tuple(D.shape)
    elif isinstance(D, torch.Tensor) and D.ndim == 2 and D.is_floating_point():
        shape = tuple(D.shape)
    else:
        raise SVDInputError("truncated_svd: D must be a 2-D floating tensor or a MatrixOperator, got "
                            f"{getattr(D, 'dtype', type(D).__name__)} {tuple(getattr(D, 'shape', ()))}")
    if k is not None and k < 0:
        raise SVDInputError(f"truncated_svd: rank {k} is negative; pass k >= 0")
    return int(shape[0]), int(shape[1])


def _project(D: torch.Tensor, Q: torch.Tensor | None) -> tuple[torch.Tensor | None, float]:
    """``(Q^T D, ||D||_F^2)`` in float64, converting D one column block at a time."""
    rows, cols = D.shape
    if D.dtype == F64:
        total = float(torch.linalg.vector_norm(D) ** 2)
        B = None if Q is None else Q.T @ D
    else:
        step = max(1, BLOCK_BYTES // (8 * max(rows, 1)))
        total, blocks = 0.0, []
        for j in range(0, cols, step):
            Dj = D[:, j:j + step].to(F64)
            total += float((Dj * Dj).sum())
            if Q is not None:
                blocks.append(Q.T @ Dj)
        B = None if Q is None else torch.cat(blocks, dim=1)
    if total != total or total == float("inf"):
        raise SVDInputError("truncated_svd: D has non-finite entries (inf or nan); check the inputs")
    return B, total


def _products(D):
    if isinstance(D, MatrixOperator):
        return D.matmul, D.rmatmul, D.dtype, D.device
    work = D if D.dtype in (torch.float32, F64) else D.float()
    return (lambda X: work @ X), (lambda Y: work.T @ Y), work.dtype, D.device


def _sketch(D, width: int, power_iters: int, seed: int):
    """Float64 ``Q`` (rows, width) spanning D's dominant range, ``B = Q^T D`` (width, cols) and ``||D||_F^2``."""
    rows, cols = D.shape
    mul, rmul, dtype, dev = _products(D)
    gen = torch.Generator(device=dev).manual_seed(int(seed))
    omega = torch.randn(cols, width, generator=gen, dtype=dtype, device=dev)
    Q = torch.linalg.qr(mul(omega)).Q
    for _ in range(power_iters):
        Z = torch.linalg.qr(rmul(Q)).Q
        Q = torch.linalg.qr(mul(Z)).Q
    Q = torch.linalg.qr(Q.to(F64)).Q
    if isinstance(D, MatrixOperator):
        return Q, rmul(Q).to(F64).T, frobenius_sq(D)
    B, total = _project(D, Q)
    return Q, B, total


def _full(D) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, float]:
    if isinstance(D, MatrixOperator):
        rows, cols = D.shape
        dense = D.matmul(torch.eye(cols, dtype=D.dtype, device=D.device)).to(F64)
        total = frobenius_sq(D)
    else:
        dense = D.to(F64)
        total = _project(D, None)[1]
    U, S, Vh = torch.linalg.svd(dense, full_matrices=False)
    return U, S, Vh, total


# Below this share of ||D||^2 the energy outside a sketch, ``||D||^2 - sum S^2``, has lost most of its digits to
# the subtraction's round-off (about eps * ||D||^2); it is then summed directly as ``||D - Q Q^T D||^2``.
OUTSIDE_RECOMPUTE = 1e-8


def _outside(D, Q: torch.Tensor, B: torch.Tensor, total: float, captured: float) -> float:
    """``||D - Q B||_F^2``, the energy outside the sketch: by subtraction, or summed directly when it is tiny.

    A low-rank D (rank below the sketch width) leaves only round-off outside; ``total - captured`` is then
    about ``eps * total`` of noise, so the direct sum (float64, column blocks, cost of one ``Q @ B``) is used.
    """
    outside = total - captured
    if outside > OUTSIDE_RECOMPUTE * total or isinstance(D, MatrixOperator):
        return max(outside, 0.0)
    rows, cols = D.shape
    step = max(1, BLOCK_BYTES // (8 * max(rows, 1)))
    direct = 0.0
    for j in range(0, cols, step):
        R = D[:, j:j + step].to(F64) - Q @ B[:, j:j + step]
        direct += float((R * R).sum())
    return direct


def _cut(U, S, Vh, total: float, k: int, method: str, outside: float | None = None) -> TruncatedSVD:
    """The first k directions of an SVD, with the exact dropped energy.

    Full: ``sum_{i>=k} S_i^2``. Randomized: ``outside + sum_{i>=k} S_i^2`` over the sketch's S (``outside``:
    ``_outside``), which equals ``||D||^2 - sum_{i<k} S_i^2``.
    """
    kept = float((S[:k] ** 2).sum())
    optimal: float | None = None
    if method == "full":
        dropped = optimal = float((S[k:] ** 2).sum())
    elif outside is None:
        dropped = max(total - kept, 0.0)
    else:
        dropped = outside + float((S[k:] ** 2).sum())
    return TruncatedSVD(U[:, :k], S[:k], Vh[:k], total, dropped, method, optimal)


def truncated_svd(D: torch.Tensor | MatrixOperator, k: int, *, power_iters: int = 2,
                  oversample: int | None = None, seed: int = 0) -> TruncatedSVD:
    """The rank-k cut of D by randomized subspace iteration (or a full SVD for small D), with its exact error.

    ``D ~ U diag(S) Vh`` with ``U = Q Ub``, ``B = Q^T D = Ub diag(S) Vh``; error
    ``||D||_F^2 - sum S^2`` (exact). Bit-identical on rerun with the same seed, device and threads.

    Args:
        D (Tensor | MatrixOperator): (rows, cols).
        k (int): rank to keep (clamped to min(rows, cols)).
        power_iters (int): q, the number of ``D D^T`` applications (2 keeps the cut within ~1% of optimal
            on decaying and low-rank-plus-noise spectra).
        oversample (int | None): p, extra sketch columns beyond k (default ``max(10, k // 2)``).
        seed (int): seed of the Gaussian test matrix (record it).

    Returns:
        TruncatedSVD with U (rows, k), S (k,), Vh (k, cols) in float64.
    """
    rows, cols = _check(D, k)
    k = min(k, rows, cols)
    p = default_oversample(k) if oversample is None else oversample
    if use_full_svd(rows, cols, k, p):
        return _cut(*_full(D), k, "full")
    Q, B, total = _sketch(D, min(k + p, rows, cols), power_iters, seed)
    Ub, S, Vh = torch.linalg.svd(B, full_matrices=False)
    outside = _outside(D, Q, B, total, float((S**2).sum()))
    return _cut(Q @ Ub, S, Vh, total, k, "randomized", outside)


def power_iters_for(k: int, rows: int, cols: int) -> int:
    """The power iterations of a rank-k cut: ``POWER_ITERS`` (2) while ``8 k <= min(rows, cols)``, else 3."""
    return POWER_ITERS if 8 * k <= min(rows, cols) else POWER_ITERS + 1


def rank_k_cut(D: torch.Tensor, k: int, *, seed: int = 0,
               sketch: Callable[[], MatrixOperator] | None = None) -> tuple[TruncatedSVD, int]:
    """The rank-k cut of a dense D: the full float64 SVD where ``use_full_svd`` holds, else ``truncated_svd``
    with ``power_iters_for(k, rows, cols)`` power iterations; the error exact either way.

    Args:
        D (Tensor): (rows, cols). k (int): the rank (clamped to min(rows, cols)). seed (int): the sketch's seed.
        sketch (Callable[[], MatrixOperator] | None): makes what the randomized path multiplies by instead of
            D (extract's float32 copy with float64 projections); called only on that path.

    Returns:
        (the cut, the power iterations it ran: 0 on the full path).
    """
    rows, cols = D.shape
    k = min(k, rows, cols)
    if use_full_svd(rows, cols, k):
        return truncated_svd(D, k), 0
    q = power_iters_for(k, rows, cols)
    return truncated_svd(D if sketch is None else sketch(), k, power_iters=q, seed=seed), q


@dataclass(frozen=True)
class EnergyCut:
    """The smallest cut found reaching an energy share, and a certified lower bound on the optimal rank.

    Args:
        svd (TruncatedSVD): the cut; ``svd.captured_share >= energy - ENERGY_SLACK``.
        energy (float): the target share E of ``||D||_F^2``.
        rank_lower_bound (int): no rank-r approximation of D with ``r < rank_lower_bound`` captures E,
            not even the optimal one, so the minimal (Eckart-Young) rank lies in
            ``[rank_lower_bound, svd.rank]``.
    """

    svd: TruncatedSVD
    energy: float
    rank_lower_bound: int

    @property
    def rank(self) -> int:
        return self.svd.rank

    @property
    def minimal(self) -> bool:
        """True when the rank is certified minimal (the bracket is closed)."""
        return self.rank_lower_bound == self.svd.rank


def _first_reaching(cum: torch.Tensor, target: float) -> int:
    """Smallest k (1-based) with ``cum[k-1] >= target``; ``len(cum) + 1`` if none."""
    return int((cum < target).sum()) + 1


def truncated_svd_energy(D: torch.Tensor | MatrixOperator, energy: float, *, start_rank: int = 16,
                         power_iters: int = 2, oversample: int | None = None, seed: int = 0) -> EnergyCut:
    """The smallest rank k whose cut captures ``energy`` of the EXACT ``||D||_F^2``, found by doubling k.

    Each round sketches with rank ``kk`` (``l = kk + oversample`` columns, oversample defaulting to
    ``max(10, kk // 2)``; restarted, so the total cost is under twice the last round's) and returns the
    smallest ``k <= kk`` with ``sum_{i<k} S_i^2 >= (E - 1e-12) ||D||^2``; if none, ``kk`` doubles; once
    the rule of ``use_full_svd`` holds, a full SVD gives the exact minimal rank.

    Why this is (nearly) minimal: the sketch's S_i are those of ``P D`` (P the projector on the
    sketch), so ``S_i <= sigma_i(D)``: the found k is never below the optimal rank k*. And since
    ``D^T D = (P D)^T (P D) + ((I-P) D)^T ((I-P) D)``, Ky Fan's inequality gives
    ``sum_{i<k} sigma_i^2 <= sum_{i<k} S_i^2 + res`` with ``res = ||D||^2 - sum_{i<l} S_i^2`` the exact
    energy outside the sketch; the smallest k where that bound reaches E is ``rank_lower_bound``. So
    ``rank_lower_bound <= k* <= rank``, certified; ``minimal`` says when they meet.

    Args:
        D (Tensor | MatrixOperator): (rows, cols).
        energy (float): target share E in (0, 1].
        start_rank (int): first sketch rank. power_iters, oversample, seed: as ``truncated_svd``.

    Returns:
        EnergyCut (rank 0 for a zero D).
    """
    rows, cols = _check(D)
    if not 0.0 < energy <= 1.0:
        raise SVDInputError(f"truncated_svd_energy: energy {energy} is outside (0, 1]; pass a share such as 0.9")
    kk = max(1, int(start_rank))
    while True:
        kk = min(kk, rows, cols)
        p = default_oversample(kk) if oversample is None else oversample
        if use_full_svd(rows, cols, kk, p) or kk == min(rows, cols):
            U, S, Vh, total = _full(D)
            if total == 0.0:
                return EnergyCut(_cut(U, S, Vh, total, 0, "full"), energy, 0)
            k = min(_first_reaching(torch.cumsum(S**2, 0), (energy - ENERGY_SLACK) * total), len(S))
            return EnergyCut(_cut(U, S, Vh, total, k, "full"), energy, k)
        Q, B, total = _sketch(D, min(kk + p, rows, cols), power_iters, seed)
        if total == 0.0:
            return EnergyCut(TruncatedSVD(Q[:, :0], B.new_zeros(0), B[:0], 0.0, 0.0, "randomized"), energy, 0)
        Ub, S, Vh = torch.linalg.svd(B, full_matrices=False)
        cum = torch.cumsum(S**2, 0)
        target = (energy - ENERGY_SLACK) * total
        k = _first_reaching(cum[:kk], target)
        if k <= kk:
            res = _outside(D, Q, B, total, float(cum[-1]))
            lower = min(_first_reaching(cum + res, target), k)
            return EnergyCut(_cut(Q @ Ub, S, Vh, total, k, "randomized", res), energy, lower)
        kk *= 2
