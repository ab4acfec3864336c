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


# -- mergekit's definitions on dense updates (issue 26), in numpy: independent of vecmerge's kernels ----------
def _np(t):
    return t.numpy() if isinstance(t, torch.Tensor) else np.asarray(t)


def _top(a, k):
    """Mask of the k largest of the flat ``a``, ties by lowest index (stable sort of -a)."""
    m = np.zeros(a.size, dtype=bool)
    m[np.argsort(-a, kind="stable")[:k]] = True
    return m


def mergekit_sparsify(x, d, how, *, gamma=0.0, epsilon=0.0, rescale=False, draw=None):
    """mergekit 0.1.5's ``sparsify`` of one dense task (numpy float64); ``draw(p)`` gives Bernoulli draws of p."""
    x = _np(x)
    if d >= 1.0:
        return x
    a = np.abs(x).reshape(-1)
    n = a.size
    if how == "magnitude":
        m = _top(a, max(1, int(d * n)))
    elif how == "outliers":
        order = np.argsort(a, kind="stable")  # ascending
        keep, n_bot = int(d * n), max(0, n - int(d * n) - int(gamma * n))
        m = np.zeros(n, dtype=bool)
        m[order[n_bot:n_bot + keep]] = True
    elif how == "random":
        m = draw(np.full(x.shape, d, dtype=np.float32)).reshape(-1).astype(bool)
    else:  # della: per row, rank 1 = smallest
        ranks = np.argsort(np.argsort(np.abs(x), axis=1, kind="stable"), axis=1).astype(np.float32) + 1
        c = x.shape[1]
        p = (d - epsilon) + ((ranks - 1) / np.float32(c - 1)) * 2 * epsilon
        m = draw(p.astype(np.float32)).reshape(-1).astype(bool)
    out = x.reshape(-1) * m
    if rescale:
        before, after = np.abs(x).sum(), np.abs(out).sum()
        if before >= 1e-7 and after >= 1e-7:
            out = out * (before / after)
    return out.reshape(x.shape)


def mergekit_gta(tasks, w, *, consensus=None, normalize=False, lam=1.0):
    """mergekit's generalized task arithmetic after sparsification: weights, sign consensus on the WEIGHTED tasks,
    division by the (agreeing) weights, lambda (numpy)."""
    T = np.stack([_np(t) for t in tasks])
    w = np.asarray(w, dtype=np.float64).reshape(-1, 1, 1)
    Y = T * w
    if consensus is None:
        mixed, div = Y.sum(0), w.sum()
        div = 1.0 if abs(div) < 1e-8 else div
    else:
        vote = Y.sum(0) if consensus == "sum" else np.sign(Y).sum(0)
        agree = np.sign(Y) == np.where(vote >= 0, 1.0, -1.0)
        mixed = (Y * agree).sum(0)
        div = (w * agree).sum(0)
        div[div == 0] = 1.0
    out = mixed / div if normalize else mixed
    return torch.from_numpy(out * lam)


def torch_draws(seed: int, module: str):
    """Bernoulli draws in float32 from a CPU generator seeded by ``module_seed(seed, module)``, task after task."""
    g = torch.Generator().manual_seed(module_seed(seed, module))
    return lambda p: torch.bernoulli(torch.from_numpy(p), generator=g).numpy()


def mergekit_sce(tasks, topk):
    T = np.stack([_np(t) for t in tasks])
    if topk < 1:
        var = T.var(axis=0)
        k = int(np.count_nonzero(var) * topk)
        T = T * _top(np.abs(var).reshape(-1), k).reshape(var.shape)
    c = (T ** 2).reshape(len(T), -1).mean(1)
    c = c / c.sum()
    agree = np.sign(T) == np.where(T.sum(0) >= 0, 1.0, -1.0)
    ew = c.reshape(-1, 1, 1) * agree
    return torch.from_numpy((T * ew).sum(0) / np.maximum(ew.sum(0), 1e-6))


def model_stock(tasks, filter_wise=False):
    """Jang et al. 2024 eq. 4 on updates: t * mean, t = N cos / (1 + (N-1) cos) (per row with filter_wise)."""
    T = [_np(t) for t in tasks]
    n = len(T)
    flat = [t.reshape(1, -1) for t in T] if not filter_wise else T
    coss = [np.clip((a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1)), -1, 1)
            for i, a in enumerate(flat) for b in flat[i + 1:]]
    cos = np.mean(coss, axis=0)
    t = n * cos / (1 + (n - 1) * cos)
    mean = sum(T) / n
    return torch.from_numpy(t.reshape(-1, 1) * mean if filter_wise else float(t[0]) * mean)


def nuslerp(x0, x1, t, axis=None):
    """Spherical interpolation of the unnormalized x0, x1 per whole matrix (axis None), row (1) or column (0)."""
    a, b = _np(x0), _np(x1)
    if axis is None:
        a2, b2 = a.reshape(1, -1), b.reshape(1, -1)
    else:
        a2, b2 = (a, b) if axis == 1 else (a.T, b.T)
    cos = np.clip((a2 * b2).sum(1) / (np.linalg.norm(a2, axis=1) * np.linalg.norm(b2, axis=1)), -1, 1)
    th = np.arccos(cos)
    c0, c1 = np.sin((1 - t) * th) / np.sin(th), np.sin(t * th) / np.sin(th)
    r = c0[:, None] * a2 + c1[:, None] * b2
    return torch.from_numpy(r.reshape(a.shape) if axis is None else (r if axis == 1 else r.T))


def multislerp(tasks, w):
    """Multi-SLERP (Goddard): tangent-space mean at the normalized weighted mean of the unit vectors, mapped back."""
    T = np.stack([_np(t).reshape(-1) for t in tasks])
    w = np.asarray(w, dtype=np.float64) / np.sum(w)
    norms = np.linalg.norm(T, axis=1)
    U = T / norms[:, None]
    m = (w[:, None] * U).sum(0)
    m /= np.linalg.norm(m)
    g = (w[:, None] * (U - (U @ m)[:, None] * m)).sum(0)
    gn = np.linalg.norm(g)
    r = (np.cos(gn) * m + np.sin(gn) * g / gn) * float(norms @ w)
    return torch.from_numpy(r.reshape(_np(tasks[0]).shape))


def karcher(tasks, iters=10, tol=1e-5):
    """The Karcher mean of the unit updates (Riemannian gradient steps, equal weights) times their mean norm."""
    T = np.stack([_np(t).reshape(-1) for t in tasks])
    norms = np.linalg.norm(T, axis=1)
    U = T / norms[:, None]
    m = U.mean(0)
    m /= np.linalg.norm(m)
    for _ in range(iters):
        th = np.arccos(np.clip(U @ m, -1, 1))
        g = sum((th_i / np.sin(th_i)) * (u - np.cos(th_i) * m) for th_i, u in zip(th, U) if th_i >= tol) / len(U)
        gn = np.linalg.norm(g)
        if gn < tol:
            break
        m = np.cos(gn) * m + np.sin(gn) * g / gn
        m /= np.linalg.norm(m)
    return torch.from_numpy((norms.mean() * m).reshape(_np(tasks[0]).shape))


# -- the spectral family's definitions on dense updates (numpy; non-zero part: s > 1e-10 s_max) ----------------
NZ = 1e-10


def _svd_nz(D):
    U, S, Vt = np.linalg.svd(_np(D), full_matrices=False)
    k = int((S > NZ * S[0]).sum()) if S.size and S[0] > 0 else 0
    return U[:, :k], S[:k], Vt[:k]


def _polar(M):
    P, _, Qt = np.linalg.svd(M, full_matrices=False)
    return P @ Qt


def tsv_m(Ds, sv_reduction=None, lam=1.0):
    """Gargiulo et al. 2025: top-k triplets of each task side by side, U and V replaced by their polar factors."""
    red = sv_reduction or 1.0 / len(Ds)
    cap = int(min(_np(Ds[0]).shape) * red)
    parts = [_svd_nz(D) for D in Ds]
    U = np.concatenate([u[:, :cap] for u, _, _ in parts], 1)
    S = np.concatenate([s[:cap] for _, s, _ in parts])
    Vt = np.concatenate([vt[:cap] for _, _, vt in parts], 0)
    return torch.from_numpy(lam * (_polar(U) * S) @ _polar(Vt.T).T)


def iso_c(Ds, lam=1.0):
    """Marczak et al. 2025, Iso-C: the sum's non-zero spectrum flattened to its mean."""
    U, S, Vt = _svd_nz(sum(_np(D) for D in Ds))
    return torch.from_numpy(lam * S.mean() * U @ Vt)


def iso_cts(Ds, fraction=0.8, lam=1.0):
    """Marczak et al. 2025, Iso-CTS: common top directions of the sum plus each task's own outside them."""
    n = len(Ds)
    U, S, Vt = _svd_nz(sum(_np(D) for D in Ds))
    k = S.size
    common = int(k * fraction)
    s = round((k - common) / n)
    kc = k - n * s
    Uc = U[:, :kc]
    us, ss, vs = [Uc], [S[:kc]], [Vt[:kc]]
    for D in Ds:
        u, si, vt = _svd_nz(_np(D) - Uc @ (Uc.T @ _np(D)))
        us.append(u[:, :s])
        ss.append(si[:s])
        vs.append(vt[:s])
    mean = np.concatenate(ss).mean()
    return torch.from_numpy(lam * mean * _polar(np.concatenate(us, 1)) @ _polar(np.concatenate(vs, 0).T).T)


def knots(mu, Ds, w, density=None, how="ties", seed=None, module=None):
    """Stoica et al. 2025: SVD of [D_1 .. D_n], representations R_i = S V_i^T merged (PEFT's TIES / DARE-TIES)."""
    n, cols = len(Ds), _np(Ds[0]).shape[1]
    U, S, Vt = _svd_nz(np.concatenate([_np(D) for D in Ds], 1))
    R = [torch.from_numpy(S[:, None] * Vt[:, i * cols:(i + 1) * cols]) for i in range(n)]
    if how == "linear":
        merged = sum(wi * r for wi, r in zip(w, R))
    else:
        merged = peft_elementwise(mu, how, R, w, [density] * n, seed=seed, module=module)
    return torch.from_numpy(U) @ merged


def svc(Ds, w, alpha=0.1, lam=1.0):
    """Singular value calibration of task arithmetic: g_r = n / sum_i max(alpha, <a_r, a_r^i> / ||a_r^i||^2)."""
    Ds = [wi * _np(D) for wi, D in zip(w, Ds)]
    M = lam * sum(Ds)
    U, S, Vt = _svd_nz(M)
    g = np.empty_like(S)
    for r in range(S.size):
        a = S[r] * Vt[r]
        terms = []
        for D in Ds:
            ai = U[:, r] @ D
            terms.append(max(alpha, float(a @ ai / (ai @ ai)) if ai @ ai > 0 else 0.0))
        g[r] = len(Ds) / sum(terms)
    return torch.from_numpy((U * (g * S)) @ Vt)
