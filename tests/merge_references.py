"""Dense references of the classic merges, shared by the tests of the methods and of MoE adapters.

Independent of vecmerge's merge code: float64 dense updates, PEFT's own ``merge_utils`` on them, numpy's SVD.
"""

from __future__ import annotations

import numpy as np
import torch

from vecmerge.linalg.merge_kernels import module_seed


def optimal_cut(D: torch.Tensor, k: int) -> torch.Tensor:
    U, S, Vh = torch.linalg.svd(D, full_matrices=False)
    return (U[:, :k] * S[:k]) @ Vh[:k]


def peft_elementwise(mu, method: str, tasks: list, w, densities, majority="total", seed=None, module=None):
    """PEFT's merge_utils definitions on dense tasks, with one density per task (prune per task)."""
    w = torch.tensor(w, dtype=torch.float64)
    if method.startswith("dare"):
        g = torch.Generator().manual_seed(module_seed(seed, module))
        T = [t * torch.bernoulli(torch.full(t.shape, d, dtype=torch.float32), generator=g).double() / d
             for t, d in zip(tasks, densities)]
    else:
        T = [mu.prune(t, d, "magnitude") for t, d in zip(tasks, densities)]
    T = torch.stack(T)
    weighted = T * w.view(-1, 1, 1)
    if method in ("ties", "dare_ties"):
        return mu.disjoint_merge(weighted, mu.calculate_majority_sign_mask(T, majority))
    return weighted.sum(0)


def principal(Ds: list, rtol=1e-10):
    """numpy's SVD of the dense updates side by side and stacked: their left/right singular vectors."""
    H = np.concatenate([d.numpy() for d in Ds], 1)
    Vt = np.concatenate([d.numpy() for d in Ds], 0)
    U, Sb, _ = np.linalg.svd(H, full_matrices=False)
    _, Sa, Vh = np.linalg.svd(Vt, full_matrices=False)
    return torch.from_numpy(U[:, Sb > rtol * Sb[0]]), torch.from_numpy(Vh[Sa > rtol * Sa[0]].T)
