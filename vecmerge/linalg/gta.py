"""mergekit's generalized task arithmetic on dense task matrices, one block of rows at a time.

mergekit 0.1.5's task arithmetic, TIES, DARE, breadcrumbs and DELLA: one method, three choices, on task deltas X_i:

    T_i = f_i * (X_i * M_i)      sparsify: magnitude (TIES) | random (DARE) | outliers (breadcrumbs) | della
    Y_i = w_i T_i                f_i: none (1) | l1 (||X_i||_1 / ||X_i * M_i||_1) | inverse (1 / d)
    consensus: none (mixed = sum_i Y_i, divisor = sum_i w_i) or the elected sign s of sum_i Y_i (``sum``) or of
    sum_i sign(Y_i) (``count``): mixed = sum_i A_i Y_i, divisor = sum_i A_i w_i, A_i = [sign(Y_i) = s]
    out = lambda * (mixed / divisor if normalize else mixed)

Unlike PEFT's TIES (``merge_kernels``) the sign is elected on the WEIGHTED tasks and the mean divides by the
agreeing weights. Random masks use mergekit's float32 draws, so a generator seeded like mergekit's gives its
masks. Two passes (masks, then row blocks): one task's dense update, n bool masks and the output in memory.
Each mask's rule and the tie-breaking: docs/design/linalg.md.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import MergeArgumentError
from .merge_kernels import _kth_largest
from .streamed import _blocks, block_rows

SPARSIFY = ("none", "magnitude", "random", "outliers", "della")
RESCALE = ("none", "l1", "inverse")
CONSENSUS = ("none", "sum", "count")
L1_EPS = 1e-7  # mergekit's: no rescale when either L1 norm is below this
DIVISOR_EPS = 1e-8  # mergekit's: a sum of weights below this divides by 1


@dataclass(frozen=True)
class Scheme:
    """One configuration of generalized task arithmetic (see the module docstring).

    Args:
        sparsify (str): none | magnitude | random | outliers | della. rescale (str): none | l1 | inverse.
        consensus (str): none | sum | count. normalize (bool): divide by the (agreeing) weights.
        lam (float): mergekit's ``lambda``, the final factor. gamma (float): outliers' share of the largest
            entries dropped. epsilon (float): della's half-range of keep probabilities.
    """

    sparsify: str = "none"
    rescale: str = "none"
    consensus: str = "none"
    normalize: bool = False
    lam: float = 1.0
    gamma: float = 0.0
    epsilon: float = 0.0

    def check(self) -> None:
        if self.sparsify not in SPARSIFY or self.rescale not in RESCALE or self.consensus not in CONSENSUS:
            raise MergeArgumentError(f"gta: sparsify {self.sparsify!r}, rescale {self.rescale!r}, consensus "
                                     f"{self.consensus!r}: use one of {SPARSIFY}, {RESCALE}, {CONSENSUS}")


def top_mask(a: torch.Tensor, k: int) -> torch.Tensor:
    """Bool mask of the ``k`` largest entries of the 1-D ``a`` (ties at the threshold: lowest index first)."""
    n = a.numel()
    if k >= n:
        return torch.ones(n, dtype=torch.bool, device=a.device)
    if k <= 0:
        return torch.zeros(n, dtype=torch.bool, device=a.device)
    thr = _kth_largest(a, k)
    mask = a > thr
    need = k - int(mask.sum())
    if need > 0:
        mask[torch.nonzero(a == thr).flatten()[:need]] = True
    return mask


def della_probabilities(x: torch.Tensor, density: float, epsilon: float) -> torch.Tensor:
    """DELLA's keep probabilities ``d - eps + 2 eps (r - 1) / (c - 1)`` per row (r: rank of |x| in its row,
    1 the smallest), in float32 as mergekit forms them (a row of one entry gets ``d - eps``).

    Args:
        x (Tensor): (rows, cols). density (float), epsilon (float): with ``0 < d - eps`` and ``d + eps < 1``.
    """
    a = x.abs()
    ranks = torch.argsort(torch.argsort(a, dim=1), dim=1).to(torch.float32) + 1
    cols = x.shape[1]
    norm = ((ranks - 1) / (cols - 1)).clamp(0, 1) if cols > 1 else torch.zeros_like(ranks)
    return (density - epsilon) + norm * 2 * epsilon


def _device(generator: torch.Generator | None) -> torch.device:
    """Where a random drop draws: the generator's device (the CPU's default generator without one)."""
    return torch.device("cpu") if generator is None else generator.device


def survivors(x: torch.Tensor, d: float, scheme: Scheme, generator: torch.Generator | None
              ) -> tuple[torch.Tensor | None, float]:
    """``(mask, f)``: which entries of one task survive (None: all) and its rescale factor.

    Args:
        x (Tensor): (rows, cols) the task, float64. d (float): its density in (0, 1].
        scheme (Scheme): the configuration. generator (torch.Generator | None): for random and della.
    """
    if scheme.sparsify == "none" or d >= 1.0:
        return None, 1.0
    n = x.numel()
    a = x.abs().reshape(-1)
    if scheme.sparsify == "magnitude":
        mask = top_mask(a, max(1, int(d * n)))
    elif scheme.sparsify == "outliers":
        keep = int(d * n)
        n_bot = max(0, n - keep - int(scheme.gamma * n))
        mask = top_mask(a, n - n_bot) & ~top_mask(a, n - n_bot - keep)
    elif scheme.sparsify == "random":
        p = torch.full(x.shape, d, dtype=torch.float32, device=_device(generator))
        mask = torch.bernoulli(p, generator=generator).to(device=x.device, dtype=torch.bool).reshape(-1)
    else:
        p = della_probabilities(x, d, scheme.epsilon).to(_device(generator))
        mask = torch.bernoulli(p, generator=generator).to(device=x.device, dtype=torch.bool).reshape(-1)
    f = 1.0
    if scheme.rescale == "inverse":
        f = 1.0 / d
    elif scheme.rescale == "l1":
        before, after = float(a.sum()), float((a * mask).sum())
        f = 1.0 if before < L1_EPS or after < L1_EPS else before / after
    return mask.reshape(x.shape), f


def combine(Y: torch.Tensor, w: torch.Tensor, scheme: Scheme) -> torch.Tensor:
    """Steps 3 and 4 on weighted tasks ``Y`` (n, b, c) with weights ``w`` (n,): consensus, normalize, lambda."""
    divisor: float | torch.Tensor
    if scheme.consensus == "none":
        mixed = Y.sum(dim=0)
        total = float(w.sum())
        divisor = 1.0 if abs(total) < DIVISOR_EPS else total
    else:
        sign = Y.sign()
        vote = Y.sum(dim=0) if scheme.consensus == "sum" else sign.sum(dim=0)
        agree = sign == torch.where(vote >= 0, 1.0, -1.0).to(Y.dtype)
        mixed = (Y * agree).sum(dim=0)
        divisor = (w.view(-1, 1, 1) * agree).sum(dim=0)
        divisor = torch.where(divisor == 0, torch.ones_like(divisor), divisor)
    if scheme.normalize:
        mixed = mixed / divisor
    return mixed * scheme.lam if scheme.lam != 1.0 else mixed


def gta_merge(task_rows, n: int, shape: tuple[int, int], w, densities, scheme: Scheme, *,
              generator: torch.Generator | None = None, rows_per_block: int | None = None,
              device=None) -> torch.Tensor:
    """Generalized task arithmetic of n tasks (see the module docstring), float64.

    Args:
        task_rows (callable): ``(i, r0, r1) -> Tensor (r1 - r0, cols)``, rows of task i (deterministic).
        n (int): tasks. shape (tuple[int, int]): (rows, cols). w (sequence[float]): (n,) weights.
        densities (sequence[float]): (n,) each task's density in (0, 1] (ignored by sparsify none).
        scheme (Scheme): the configuration. generator (torch.Generator | None): random and della's draws,
            task after task in order. rows_per_block (int | None): block height. device: of the result.

    Returns:
        (rows, cols) Tensor.
    """
    scheme.check()
    rows, cols = int(shape[0]), int(shape[1])
    ds = list(densities)
    if len(ds) != n or not all(0.0 < d <= 1.0 for d in ds):
        raise MergeArgumentError(f"gta: densities {ds} for {n} tasks: one per task, each in (0, 1]")
    if scheme.sparsify in ("random", "della") and generator is None and any(d < 1.0 for d in ds):
        raise MergeArgumentError("gta: random drops need a seeded torch.Generator")
    wt = torch.as_tensor(list(w), dtype=torch.float64, device=device)
    if wt.shape != (n,) or not bool(torch.isfinite(wt).all()):
        raise MergeArgumentError(f"gta: {len(list(w))} weights for {n} tasks, all finite; give one per task")
    keep = [survivors(task_rows(i, 0, rows), ds[i], scheme, generator) for i in range(n)]
    out = torch.empty(rows, cols, dtype=torch.float64, device=device)
    for r0, r1 in _blocks(rows, rows_per_block or block_rows(n, cols)):
        X = torch.stack([task_rows(i, r0, r1) for i in range(n)])
        for i, (mask, f) in enumerate(keep):
            if mask is not None:
                X[i] = X[i] * mask[r0:r1].to(X.device)
            if f != 1.0:
                X[i] = X[i] * f
        out[r0:r1] = combine(X * wt.view(-1, 1, 1), wt, scheme)
    if not bool(torch.isfinite(out).all()):
        raise MergeArgumentError("gta: non-finite value in a model's update; check the inputs")
    return out


SCE_CLAMP = 1e-6  # mergekit's floor of the summed agreeing SCE weights (they sum to 1)


def sce_merge(task_rows, n: int, shape: tuple[int, int], select_topk: float = 1.0, *,
              rows_per_block: int | None = None, device=None) -> torch.Tensor:
    """SCE (Wan et al. 2024, arXiv 2408.07990, as mergekit 0.1.5's ``sce``): select, calculate, erase.

    1. select: with ``select_topk < 1`` keep the ``k = int(select_topk * nnz(var))`` entries of largest
       variance across the tasks, ``var = mean_i (X_i - mean_j X_j)^2`` (one mask ``M`` for all tasks);
    2. calculate: ``T_i = X_i * M``, weights ``c_i = mean(T_i^2) / sum_j mean(T_j^2)`` (uniform when the
       sum is 0: mergekit's switches to uniform below 1e-6, which the small entries of a LoRA update reach);
    3. erase: ``A_i = [sign(T_i) = sign(sum_j T_j)]`` (+1 at 0), result
       ``sum_i A_i c_i T_i / max(sum_i A_i c_i, 1e-6)``.

    Args:
        task_rows (callable): ``(i, r0, r1) -> Tensor (r1 - r0, cols)``. n (int): tasks.
        shape (tuple[int, int]): (rows, cols). select_topk (float): in (0, 1]. device: of the result.
    """
    rows, cols = int(shape[0]), int(shape[1])
    if not 0.0 < select_topk <= 1.0:
        raise MergeArgumentError(f"sce: select_topk={select_topk}: a share in (0, 1]")
    blocks = _blocks(rows, rows_per_block or block_rows(n, cols))
    mask = None
    if select_topk < 1.0:
        var = torch.empty(rows, cols, dtype=torch.float64, device=device)
        for r0, r1 in blocks:
            var[r0:r1] = torch.stack([task_rows(i, r0, r1) for i in range(n)]).var(dim=0, unbiased=False)
        k = int(int(torch.count_nonzero(var)) * select_topk)
        mask = top_mask(var.reshape(-1), k).reshape(rows, cols)
    sq = torch.zeros(n, dtype=torch.float64, device=device)
    for r0, r1 in blocks:
        for i in range(n):
            t = task_rows(i, r0, r1)
            sq[i] += float(((t * mask[r0:r1]) if mask is not None else t).square().sum())
    c = sq / (rows * cols)
    c = c / c.sum() if float(c.sum()) > 0 else torch.full_like(c, 1.0 / n)
    out = torch.empty(rows, cols, dtype=torch.float64, device=device)
    for r0, r1 in blocks:
        T = torch.stack([task_rows(i, r0, r1) for i in range(n)])
        if mask is not None:
            T = T * mask[r0:r1]
        agree = T.sign() == torch.where(T.sum(dim=0) >= 0, 1.0, -1.0).to(T.dtype)
        ew = c.view(-1, 1, 1) * agree
        out[r0:r1] = (T * ew).sum(dim=0) / ew.sum(dim=0).clamp(min=SCE_CLAMP)
    return out
