"""The one rank cut: any module update back into LoRA factors of the rank a ``RankPolicy`` chooses.

For an update with thin SVD ``U S V^T`` (from its small core) the policy picks k and the written factors are

    B = U_k sqrt(S_k),   A = sqrt(S_k) Vh_k,   error = sqrt(sum_{i>=k} S_i^2)   (Eckart-Young, exact)

Policies (``rank_policy.RankPolicy``): ``exact`` (drop only float64 round-off, ``EXACT_RTOL``), ``N``,
``energy:E`` (keep E of ``||update||^2``), ``step-energy:E`` (lose at most 1 - E of ``||step||^2``) and
``keep-base`` (the backbone's factors bit for bit, the step's appended). ``rank=k`` forces a common rank,
zero-padded (``pipeline.experts``). A dense update (``dense.Dense``) is cut by ``randsvd`` with its error
still exact: ``||D||^2 - sum_{i<k} S_i^2``. ``cut`` serves the pipeline, ``refactor`` and ``verify``.
Each policy's rule and the randomized path's measurements: docs/design/linalg.md.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from ..errors import RecipeError
from .dense import Dense
from .lowrank import EXACT_RTOL, LowRank, f64
from .randsvd import POWER_ITERS, rank_k_cut, truncated_svd_energy
from .rank_policy import RankPolicy

__all__ = ["RankPolicy", "Cut", "cut"]


@dataclass(frozen=True)
class Cut:
    """One module re-factored.

    Args:
        factors (LowRank): the factors to write (scale folded to 1, or the backbone's scale for keep-base).
        rank (int): kept rank. exact_rank (int): the update's numerical rank.
        error (float): ``||written - update||_F`` of the cut (before dtype rounding): the dropped
            singular values, ``sqrt(sum_{i>=k} S_i^2)``.
        norm (float): ``||update||_F``.
        kept (Tensor | None): (p, q) the kept part as a core of the module's basis (for a core input).
        method (str): ``core`` (SVD of the small core), ``full`` (full SVD of a dense update),
            ``randomized`` (randomized truncated SVD of a dense update) or ``factors`` (written as given).
        power_iters (int | None): randomized only: the power iterations used.
        cores (tuple[Tensor, Tensor] | None): ``(Qb^T B (p, rank), A Qa (rank, q))`` of the written factors
            for a core input (``U_k sqrt(S_k)``, ``sqrt(S_k) V_k^T``), so measuring the rounding need not
            project them again.
    """

    factors: LowRank
    rank: int
    exact_rank: int | None
    error: float
    norm: float
    kept: torch.Tensor | None = None
    method: str = "core"
    power_iters: int | None = None
    cores: tuple | None = None

    @property
    def rel_error(self) -> float:
        """``error / norm`` (the absolute error for a zero update)."""
        return self.error / self.norm if self.norm > 0 else self.error


def _cat(x: torch.Tensor, y: torch.Tensor, dim: int) -> torch.Tensor:
    return torch.cat([f64(x), f64(y)], dim) if y.numel() else x


def _keep_base(target, backbone: LowRank | None, step) -> Cut:
    """Backbone factors kept bit for bit; the step's exact factors, divided by its scale, appended.

    A backbone module of scale 0 (``lora_alpha`` 0) has no update to keep, and its factors could only carry the
    step under a non-zero scale, which would add them to the update: it is written as the step alone.
    """
    if step is None:
        raise RecipeError(["rank=keep-base: needs dir (it keeps the backbone and appends the step)"])
    b0 = (backbone if backbone is not None and backbone.scale != 0
          else LowRank.zeros(target.shape, step.space.device))
    s = step.svd()
    upd = s.truncate(s.exact_rank())
    sc = b0.scale
    x = LowRank(_cat(b0.B, upd.B / sc, 1), _cat(b0.A, upd.A, 0), sc)
    return Cut(x, x.rank, x.rank, s.dropped_error(upd.rank), target.norm(), target.C)


def pad(x: LowRank, rank: int) -> LowRank:
    """``x`` with zero directions appended up to ``rank`` (zero columns of B, zero rows of A): the same update."""
    extra = rank - x.rank
    if extra <= 0:
        return x
    B = torch.cat([x.B, x.B.new_zeros(x.B.shape[0], extra)], 1)
    return LowRank(B, torch.cat([x.A, x.A.new_zeros(extra, x.A.shape[1])], 0), x.scale)


def _padded(c: Cut, rank: int | None) -> Cut:
    if rank is None or rank <= c.rank:
        return c
    cores = None
    if c.cores is not None:
        L, Rc = c.cores
        cores = (torch.cat([L, L.new_zeros(L.shape[0], rank - c.rank)], 1),
                 torch.cat([Rc, Rc.new_zeros(rank - c.rank, Rc.shape[1])], 0))
    return dataclasses.replace(c, factors=pad(c.factors, rank), rank=rank, cores=cores)


def _split(U: torch.Tensor, S: torch.Tensor, Vh: torch.Tensor, k: int) -> LowRank:
    root = torch.sqrt(S[:k])
    return LowRank(U[:, :k] * root, root[:, None] * Vh[:k], 1.0)


def _roundoff_rank(S: torch.Tensor, k: int, dropped: float, total: float) -> int:
    """Largest k' <= k whose cut drops no more than round-off beyond ``dropped``: trailing S_i with
    ``sum_{i>=k'} S_i^2 <= EXACT_RTOL^2 ||D||^2`` are not rank (an update of rank below k)."""
    tail = dropped
    while k > 0 and tail + float(S[k - 1] ** 2) <= (EXACT_RTOL**2) * total:
        tail += float(S[k - 1] ** 2)
        k -= 1
    return k


def _dense_cut(x: Dense, policy: RankPolicy, seed: int) -> Cut:
    """A dense update cut by the full SVD (``exact``) or the randomized one (``N``, ``energy:E``), error exact."""
    D = x.D
    if policy.kind == "exact":
        U, S, Vh = torch.linalg.svd(D, full_matrices=False)
        k, exact = policy.choose(S)
        err = float(torch.sqrt((S[k:] ** 2).sum()))
        return Cut(_split(U, S, Vh, k), k, exact, err, float(torch.linalg.vector_norm(S)), method="full")
    if policy.kind == "fixed":
        t, iters = rank_k_cut(D, int(policy.value), seed=seed)
    else:
        iters = POWER_ITERS
        t = truncated_svd_energy(D, policy.value, power_iters=iters, seed=seed).svd
    k = _roundoff_rank(t.S, t.rank, t.dropped_energy, t.total_energy)
    dropped = t.dropped_energy + float((t.S[k:] ** 2).sum())
    return Cut(_split(t.U, t.S, t.Vh, k), k, None, max(dropped, 0.0) ** 0.5, t.total_energy**0.5,
               method=t.method, power_iters=iters if t.method == "randomized" else None)


def cut(x, policy: RankPolicy, *, backbone: LowRank | None = None, step=None, rank: int | None = None,
        seed: int = 0) -> Cut:
    """Re-factor ``x`` at the rank ``policy`` chooses (see the module docstring).

    Args:
        x (InSpan | LowRank | Dense): the update, (out, in): a core in a module's basis, factors of any
            rank, or a dense matrix.
        policy (RankPolicy): the rank rule.
        backbone (LowRank | None): keep-base only: the backbone adapter's own factors of this module.
        step (InSpan | LowRank | None): the step in ``x`` (keep-base appends it; step-energy measures it).
        rank (int | None): a common rank instead of the policy's choice: keep ``min(rank, exact)``
            directions, pad with zero directions to ``rank``.
        seed (int): Dense only: the seed of the randomized SVD's test matrix (record it).

    Returns:
        Cut with the exact error of the cut (Eckart-Young for the SVD of a core or factors; for a dense
        update ``||D||^2 - sum S^2`` from D itself).
    """
    if policy.kind == "keep-base":
        return _padded(_keep_base(x, backbone, step), rank)
    if isinstance(x, Dense):
        return _padded(_dense_cut(x, policy, seed), rank)
    step_norm = None if step is None else step.norm()
    if isinstance(x, LowRank):
        s = x.svd()
        k, exact = policy.choose(s.S, s.floor, step_norm)
        k = k if rank is None else min(rank, exact)
        norm = float((s.S**2).sum().sqrt())
        return _padded(Cut(s.truncate(k), k, exact, s.dropped_error(k), norm), rank)
    U, S, Vh = torch.linalg.svd(x.C, full_matrices=False)
    k, exact = policy.choose(S, x.floor, step_norm)
    k = k if rank is None else min(rank, exact)
    root = torch.sqrt(S[:k])
    L, Rc = U[:, :k] * root, root[:, None] * Vh[:k]
    factors = LowRank(x.space.left(L), x.space.right(Rc), 1.0)
    kept = (U[:, :k] * S[:k]) @ Vh[:k]
    c = Cut(factors, k, exact, float(torch.sqrt((S[k:] ** 2).sum())), float(torch.linalg.vector_norm(S)), kept,
            cores=(L, Rc))
    return _padded(c, rank)
