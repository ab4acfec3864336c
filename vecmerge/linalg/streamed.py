"""Element-wise merges of dense updates, one block of rows at a time: TIES, DARE, magnitude pruning.

``merge_kernels`` holds the methods on a whole stack ``X`` (n, rows, cols), about six times its size in
temporaries. Here the same operations run in two passes over row blocks of tasks given by ``task_rows(i,
r0, r1)``: (1) what survives of each task (its exact magnitude threshold over the whole task, or its DARE
mask drawn in one call as ``merge_kernels.dare_drop`` draws it); (2) per row block, trim or drop each task,
then the weighted sum or TIES' election and disjoint mean. On one block the result is bit-identical to
``merge_kernels``; on several the sums over tasks may differ in the last bit. Why: docs/design/linalg.md.
"""

from __future__ import annotations

import torch

from ..errors import MergeArgumentError
from .merge_kernels import MAJORITY, _kth_largest, _weighted, densities, disjoint_mean, majority_sign_mask

DROPS = ("magnitude", "random")
COMBINES = ("sum", "ties")
BLOCK_BYTES = 8 * 2**20  # float64 bytes of all tasks' rows in one block


def block_rows(n: int, cols: int, budget: int = BLOCK_BYTES) -> int:
    """Rows per block so that n tasks' rows take about ``budget`` bytes in float64 (at least 1)."""
    return max(1, budget // max(1, 8 * n * cols))


def _blocks(rows: int, step: int):
    return [(r0, min(rows, r0 + step)) for r0 in range(0, rows, step)]


def _survivors(task_rows, n, rows, cols, ds, drop, blocks, generator, mask_dtype, dtype, device):
    """Per task: None (kept whole), ``("magnitude", thr, ties_kept)`` or ``("random", bool mask)``."""
    out: list[tuple | None] = []
    for i, d in enumerate(ds):
        if d >= 1.0:
            out.append(None)
        elif drop == "random":
            p = torch.full((rows, cols), d, dtype=mask_dtype or dtype, device=generator.device)
            out.append(("random", torch.bernoulli(p, generator=generator).to(torch.bool)))
        else:
            a = torch.empty(rows, cols, dtype=dtype, device=device)
            for r0, r1 in blocks:
                torch.abs(task_rows(i, r0, r1), out=a[r0:r1])
            a = a.reshape(-1)
            k = int(d * a.numel())  # PEFT's count, float product truncated
            if k >= a.numel():
                out.append(None)
            elif k == 0:
                out.append(("magnitude", torch.tensor(float("inf"), dtype=a.dtype, device=a.device), 0))
            else:
                thr = _kth_largest(a, k, inplace=True)  # a is ours; only a count is read after
                out.append(("magnitude", thr, k - int((a > thr).sum())))
    return out


def streamed_merge(task_rows, n: int, shape: tuple[int, int], w, density, drop: str, combine: str, *,
                   majority: str = "total", generator: torch.Generator | None = None,
                   mask_dtype: torch.dtype | None = None, rows_per_block: int | None = None,
                   dtype: torch.dtype = torch.float64, device=None) -> torch.Tensor:
    """The element-wise merge of n tasks, block by block (see the module docstring).

    ``drop`` magnitude + combine sum is ``magnitude_prune``, magnitude + ties is ``ties``, random + sum
    ``dare_linear``, random + ties ``dare_ties``: ``sum_i w_i T_i`` or ``sum_i A_i w_i T_i / max(1, sum_i A_i)``
    with ``T_i`` the trimmed or dropped (and rescaled) task and ``A_i = [sign(T_i) = elected sign]``.

    Args:
        task_rows (callable): ``(i, r0, r1) -> Tensor (r1 - r0, cols)``, rows of task i (deterministic).
        n (int): tasks. shape (tuple[int, int]): (rows, cols). w (sequence[float]): (n,) weights.
        density (float | sequence[float]): in (0, 1], one or one per task.
        drop (str): ``magnitude`` or ``random``. combine (str): ``sum`` or ``ties``.
        majority (str): TIES' election, ``total`` or ``frequency``. generator (torch.Generator): DARE's stream.
        mask_dtype (torch.dtype | None): dtype of DARE's draws (default ``dtype``).
        rows_per_block (int | None): block height (default ``block_rows(n, cols)``).
        dtype (torch.dtype): of the tasks and the result. device: of the result.

    Returns:
        (rows, cols) Tensor.
    """
    rows, cols = int(shape[0]), int(shape[1])
    ds = densities(density, n)
    if not all(isinstance(d, (int, float)) and 0.0 < d <= 1.0 for d in ds):
        raise MergeArgumentError(f"merge: density {density} is outside (0, 1]; pass the share of entries to keep")
    if drop not in DROPS or combine not in COMBINES or majority not in MAJORITY:
        raise MergeArgumentError(f"merge: drop {drop!r}, combine {combine!r}, majority {majority!r}: use one of "
                                 f"{DROPS}, {COMBINES}, {MAJORITY}")
    if drop == "random" and generator is None and any(d < 1.0 for d in ds):
        raise MergeArgumentError("merge: random drops need a seeded torch.Generator")
    wt = torch.as_tensor(list(w), dtype=dtype, device=device)
    if wt.shape != (n,) or not bool(torch.isfinite(wt).all()):
        raise MergeArgumentError(f"merge: {len(list(w))} weights for {n} tasks, all finite; give one per task")
    blocks = _blocks(rows, rows_per_block or block_rows(n, cols))
    keep = _survivors(task_rows, n, rows, cols, ds, drop, blocks, generator, mask_dtype, dtype, device)
    left = [k[2] if k is not None and k[0] == "magnitude" else 0 for k in keep]
    out = torch.empty(rows, cols, dtype=dtype, device=device)
    for r0, r1 in blocks:
        X = torch.stack([task_rows(i, r0, r1) for i in range(n)])
        for i, k in enumerate(keep):
            if k is None:
                continue
            if k[0] == "random":
                X[i] = X[i] * k[1][r0:r1].to(device=X.device, dtype=X.dtype) / ds[i]
                continue
            a = X[i].abs()
            mask = a > k[1]
            if left[i] > 0:
                tied = torch.nonzero((a == k[1]).reshape(-1)).flatten()[:left[i]]
                mask.view(-1)[tied] = True
                left[i] -= int(tied.numel())
            X[i] = X[i] * mask
        if combine == "sum":
            out[r0:r1] = _weighted(X, wt).sum(dim=0)
        else:
            out[r0:r1] = disjoint_mean(_weighted(X, wt), majority_sign_mask(X, majority))
    if not bool(torch.isfinite(out).all()):  # a NaN or inf in any task reaches the output (NaN * 0 = NaN)
        raise MergeArgumentError("merge: non-finite value in a model's update; check the inputs")
    return out
