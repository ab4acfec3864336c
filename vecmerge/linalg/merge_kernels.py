"""Element-wise merge kernels (magnitude pruning, TIES, DARE) and SLERP coefficients, as PEFT defines them.

Every kernel takes a stack ``X`` (n, rows, cols) of task matrices (the dense updates of one module, or its
cores in one shared basis) and weights ``w`` (n,), and returns one (rows, cols) matrix in ``X``'s dtype,
following PEFT 0.21's ``peft.utils.merge_utils`` step for step (bit-identical on the same inputs): magnitude
trimming keeps ``k = int(d * numel)`` entries per task; TIES elects the sign on the UNWEIGHTED trimmed tasks
and divides by the COUNT of agreeing tasks; DARE keeps each entry with probability ``d`` and rescales by
``1/d`` (a CPU generator seeded like PEFT's gives PEFT's masks). The density ``d`` lies in (0, 1].
Where and why this differs from PEFT at the edges, and from mergekit: docs/design/linalg.md.
"""

from __future__ import annotations

import hashlib
import math

import numpy as np
import torch

from ..errors import MergeArgumentError

MAJORITY = ("total", "frequency")
SLERP_DOT_THRESHOLD = 0.9995  # mergekit's: |cos| above this is treated as colinear (lerp)


def _check(X: torch.Tensor, w, density=None, majority: str | None = None) -> torch.Tensor:
    if X.ndim != 3 or not X.is_floating_point():
        raise MergeArgumentError(f"merge kernel: X must be a floating (n, rows, cols) stack, got {X.dtype} "
                                 f"{tuple(X.shape)}; stack the tasks with torch.stack")
    w = torch.as_tensor(w, dtype=X.dtype, device=X.device)
    if w.shape != (X.shape[0],):
        raise MergeArgumentError(f"merge kernel: weights have shape {tuple(w.shape)}, expected ({X.shape[0]},): "
                                 "one weight per task")
    if not bool(torch.isfinite(w).all()) or not bool(torch.isfinite(X).all()):
        raise MergeArgumentError("merge kernel: non-finite value in the tasks or weights; check the inputs")
    if density is not None:
        ds = densities(density, X.shape[0])
        if not all(isinstance(d, (int, float)) and 0.0 < d <= 1.0 for d in ds):
            raise MergeArgumentError(f"merge kernel: density {density} is outside (0, 1]; pass the share of "
                                     "entries to keep, e.g. 0.5")
    if majority is not None and majority not in MAJORITY:
        raise MergeArgumentError(f"merge kernel: majority {majority!r} is not one of {', '.join(MAJORITY)}")
    return w


def densities(density, n: int) -> list:
    """One density per task: ``density`` itself when it is a sequence of n, else ``[density] * n``.

    Args:
        density (float | sequence[float]): one share for all tasks, or one per task. n (int): tasks.
    """
    if isinstance(density, (int, float)):
        return [density] * n
    ds = list(density)
    if len(ds) != n:
        raise MergeArgumentError(f"merge kernel: {len(ds)} densities for {n} tasks; give one, or one per task")
    return ds


def _weighted(X: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return X * w.view(-1, *([1] * (X.ndim - 1)))


def _kth_largest(a: torch.Tensor, k: int, inplace: bool = False) -> torch.Tensor:
    """The k-th largest entry of the 1-D ``a`` (a value: any selection algorithm gives the same one).

    On the CPU numpy's introselect (``np.partition``) is about 10x faster than ``torch.kthvalue``; with
    ``inplace`` it reorders ``a`` itself instead of a copy (for a caller that needs only counts after).
    """
    n = a.numel()
    if a.device.type == "cpu" and a.dtype in (torch.float32, torch.float64):
        if inplace:
            arr = a.numpy()
            arr.partition(n - k)
            return torch.as_tensor(arr[n - k])
        return torch.as_tensor(np.partition(a.numpy(), n - k)[n - k])
    return torch.kthvalue(a, n - k + 1).values


def magnitude_mask(x: torch.Tensor, density: float) -> torch.Tensor:
    """Boolean mask of the ``k = int(density * x.numel())`` largest ``|x|``; ties at the threshold by lowest flat index.

    Args:
        x (Tensor): any shape. density (float): share to keep, in (0, 1].

    Returns:
        bool Tensor of ``x``'s shape with exactly ``k`` True entries.
    """
    a = x.abs().reshape(-1)
    n = a.numel()
    k = int(density * n)  # PEFT's count, float product truncated
    if k >= n:
        return torch.ones_like(x, dtype=torch.bool)
    mask = torch.zeros(n, dtype=torch.bool, device=x.device)
    if k > 0:
        thr = _kth_largest(a, k)
        mask = a > thr
        need = k - int(mask.sum())
        if need > 0:
            mask[torch.nonzero(a == thr).flatten()[:need]] = True
    return mask.reshape(x.shape)


def trim(X: torch.Tensor, density) -> torch.Tensor:
    """Each task with all but its top ``density`` share of entries by magnitude set to zero: ``X_i * M_i``.

    Args:
        X (Tensor): (n, rows, cols). density (float | sequence[float]): in (0, 1], one or one per task.
    """
    ds = densities(density, X.shape[0])
    if all(d >= 1.0 for d in ds):
        return X
    out = torch.empty_like(X)
    for i, (x, d) in enumerate(zip(X, ds)):
        if d >= 1.0:
            out[i] = x
        else:
            torch.mul(x, magnitude_mask(x, d), out=out[i])
    return out


def magnitude_prune(X: torch.Tensor, w, density) -> torch.Tensor:
    """Weighted sum of the magnitude-trimmed tasks: ``sum_i w_i (X_i * M_i)``, as PEFT's ``magnitude_prune``.

    Args:
        X (Tensor): (n, rows, cols) tasks. w (Tensor | sequence): (n,) weights.
        density (float | sequence[float]): in (0, 1], one for all tasks or one per task.

    Returns:
        (rows, cols) Tensor.
    """
    w = _check(X, w, density)
    return _weighted(trim(X, density), w).sum(dim=0)


def majority_sign_mask(T: torch.Tensor, majority: str = "total") -> torch.Tensor:
    """Which entries agree with the elected sign: ``sign(T_i) == s``, ``s = +1 if sum_i v_i >= 0 else -1``.

    ``v_i = T_i`` for ``"total"``, ``v_i = sign(T_i)`` for ``"frequency"``; zeros never agree.

    Args:
        T (Tensor): (n, rows, cols) trimmed (or dropped) tasks, unweighted.
        majority (str): ``"total"`` or ``"frequency"``.
    """
    sign = T.sign()
    vote = T.sum(dim=0) if majority == "total" else sign.sum(dim=0)
    return sign == torch.where(vote >= 0, 1, -1)


def disjoint_mean(weighted: torch.Tensor, agree: torch.Tensor) -> torch.Tensor:
    """``sum_i agree_i * weighted_i / max(1, sum_i agree_i)``: the mean over agreeing tasks, 0 where none agree.

    Args:
        weighted (Tensor): (n, rows, cols) weighted tasks. agree (Tensor): (n, rows, cols) bool.
    """
    return (weighted * agree).sum(dim=0) / torch.clamp(agree.sum(dim=0), min=1.0)


def ties(X: torch.Tensor, w, density, majority: str = "total") -> torch.Tensor:
    """TIES as PEFT's ``ties``: trim, elect the sign on the unweighted trimmed tasks, disjoint mean of ``w_i T_i``.

    ``T_i = X_i * M_i`` (top ``density`` by magnitude), ``A_i = [sign(T_i) == s]`` (``majority_sign_mask``),
    result ``= sum_i A_i w_i T_i / max(1, sum_i A_i)``.

    Args:
        X (Tensor): (n, rows, cols) tasks. w (Tensor | sequence): (n,) weights.
        density (float | sequence[float]): in (0, 1], one for all tasks or one per task.
        majority (str): ``"total"`` (paper, PEFT default) or ``"frequency"``.

    Returns:
        (rows, cols) Tensor.
    """
    w = _check(X, w, density, majority)
    T = trim(X, density)
    return disjoint_mean(_weighted(T, w), majority_sign_mask(T, majority))


def dare_drop(X: torch.Tensor, density, generator: torch.Generator, mask_dtype: torch.dtype | None = None
              ) -> torch.Tensor:
    """Each task's entries kept with probability ``density`` and rescaled: ``X_i * Bernoulli(d_i) / d_i``.

    Draws one Bernoulli tensor per task, in order, from ``generator`` (none for a task with ``d_i == 1``).
    The mask is drawn in ``mask_dtype`` (default X's, as PEFT does; float32 and float64 draws differ for
    one seed), on the generator's device, then applied to X in X's dtype.

    Args:
        X (Tensor): (n, rows, cols). density (float | sequence[float]): in (0, 1], one or one per task.
        generator (torch.Generator): the random stream. mask_dtype (torch.dtype | None): dtype of the draws.
    """
    ds = densities(density, X.shape[0])
    if all(d >= 1.0 for d in ds):
        return X
    out = []
    for x, d in zip(X, ds):
        if d >= 1.0:
            out.append(x)
            continue
        p = torch.full(x.shape, d, dtype=mask_dtype or x.dtype, device=generator.device)
        mask = torch.bernoulli(p, generator=generator).to(device=x.device, dtype=x.dtype)
        out.append(x * mask / d)
    return torch.stack(out)


def dare_linear(X: torch.Tensor, w, density, generator: torch.Generator, mask_dtype: torch.dtype | None = None
                ) -> torch.Tensor:
    """DARE then task arithmetic, as PEFT's ``dare_linear``: ``sum_i w_i X_i * Bernoulli(d) / d``.

    Unbiased: ``E[result] = sum_i w_i X_i``.

    Args:
        X (Tensor): (n, rows, cols) tasks. w (Tensor | sequence): (n,) weights.
        density (float | sequence[float]): in (0, 1], one for all tasks or one per task.
        generator (torch.Generator): the random stream (seed it and record the seed).
        mask_dtype (torch.dtype | None): dtype of the Bernoulli draws (see ``dare_drop``).
    """
    w = _check(X, w, density)
    return _weighted(dare_drop(X, density, generator, mask_dtype), w).sum(dim=0)


def dare_ties(X: torch.Tensor, w, density, generator: torch.Generator, majority: str = "total",
              mask_dtype: torch.dtype | None = None) -> torch.Tensor:
    """DARE then TIES' election and disjoint mean, as PEFT's ``dare_ties`` (no magnitude trim).

    ``T_i = X_i * Bernoulli(d) / d``, then as ``ties``: ``sum_i A_i w_i T_i / max(1, sum_i A_i)``.

    Args:
        X (Tensor): (n, rows, cols) tasks. w (Tensor | sequence): (n,) weights.
        density (float | sequence[float]): in (0, 1], one for all tasks or one per task.
        generator (torch.Generator): the random stream. majority (str): ``"total"`` or ``"frequency"``.
        mask_dtype (torch.dtype | None): dtype of the Bernoulli draws (see ``dare_drop``).
    """
    w = _check(X, w, density, majority)
    T = dare_drop(X, density, generator, mask_dtype)
    return disjoint_mean(_weighted(T, w), majority_sign_mask(T, majority))


def module_seed(seed: int, module: str) -> int:
    """A 63-bit seed for one module: ``int.from_bytes(sha256(f"{seed}:{module}")[:8], "little") >> 1``.

    With one generator per module seeded this way, a module's DARE masks do not depend on which
    other modules are merged or in what order (unlike PEFT's single global stream).
    """
    digest = hashlib.sha256(f"{int(seed)}:{module}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def slerp_coefficients(norm0: float, norm1: float, inner01: float, t: float,
                       dot_threshold: float = SLERP_DOT_THRESHOLD) -> tuple[float, float]:
    """SLERP as a linear combination: ``slerp(x0, x1, t) = c0 x0 + c1 x1`` from norms and the inner product.

    With ``cos = <x0, x1> / (||x0|| ||x1||)`` and ``theta = arccos(cos)``::

        c0 = sin((1 - t) theta) / sin(theta),   c1 = sin(t theta) / sin(theta)

    applied to the UNnormalized vectors (mergekit's definition). Fallback to linear interpolation
    ``(1 - t, t)`` when ``|cos| > dot_threshold`` (0.9995, mergekit's; near-colinear or near-opposite)
    and when either norm is zero (no direction; mergekit's ``eps = 1e-8`` guard would instead give
    ``(cos(t pi/2), sin(t pi/2))`` there). Any norm above zero is normalized (no absolute epsilon).
    Inputs are scalars, so the merge runs exactly in factored form, per module or over all modules
    (pass the summed squared norms' roots and summed inner products).

    Args:
        norm0 (float): ``||x0||_F``. norm1 (float): ``||x1||_F``. inner01 (float): ``<x0, x1>_F``.
        t (float): interpolation parameter (0 gives x0, 1 gives x1); any finite value.
        dot_threshold (float): the colinearity threshold on ``|cos|``.

    Returns:
        (c0, c1) floats.
    """
    vals = (norm0, norm1, inner01, t)
    if not all(math.isfinite(v) for v in vals) or norm0 < 0 or norm1 < 0:
        raise MergeArgumentError(f"slerp: norms, inner product and t must be finite with norms >= 0, got {vals}")
    if norm0 == 0.0 or norm1 == 0.0:
        return 1.0 - t, t
    cos = inner01 / (norm0 * norm1)
    if abs(cos) > dot_threshold:
        return 1.0 - t, t
    theta = math.acos(max(-1.0, min(1.0, cos)))
    sin_theta = math.sin(theta)
    return math.sin((1.0 - t) * theta) / sin_theta, math.sin(t * theta) / sin_theta
