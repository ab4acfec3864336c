"""What TIES, DARE and magnitude pruning share: their fields, their checks, and where they run.

Each is an element-wise merge ``kernel(X, w, d)`` of ``merge_kernels`` on a stack ``X`` of the models'
updates of one module, either

- ``space: full``: the models' dense updates ``DeltaW_i`` (out x in), formed one module at a time from
  the module's cores (``Qb C_i Qa^T``): the method as the papers and PEFT's ``*_svd`` define it; its
  result has full rank, so it is cut to ``rank`` (required) by a randomized SVD with an exact error;
- ``space: core``: the models' cores in the module's principal bases (after Core Space merging,
  Panariello et al. 2025): never dense, exact at ``rank: exact`` (rank <= p). The bases are the left
  singular vectors ``U`` of ``[DeltaW_1 .. DeltaW_n]`` and the right ones ``V`` of ``[DeltaW_1; ..;
  DeltaW_n]`` (those with a non-zero singular value), found from the small cores ``C_i`` (p x q) of the
  module's shared basis; the method runs on ``U^T DeltaW_i V`` and is lifted back by ``U . V^T``. So the
  result depends on the updates alone: not on the gauge of their factors (``B A = (B G)(G^-1 A)``), nor
  on the order of the models (the element-wise methods commute with the sign of a basis vector).

Both run ``streamed.streamed_merge``: in full space one block of rows of every model at a time (the
models' rows formed on demand from the cores, kept between the two passes when they fit in
``KEEP_BYTES``), so a module's working memory is about its output and one model's update; in core space
on the small cores in one block (bit-identical to ``merge_kernels``, which match PEFT's ``merge_utils``).
Every model's density is its own ``density`` in ``models``, else the recipe's ``density``. Imports of
torch happen inside the methods, so ``vecmerge --help`` stays fast.
"""

from __future__ import annotations

from ..errors import Problem
from .base import Field, Method

SPACES = ("full", "core")
MAJORITIES = ("total", "frequency")  # merge_kernels.MAJORITY, without importing torch here

DENSITY = Field("density", "share of each model's entries kept, in (0, 1] (per model: density in models)",
                low=0.0, high=1.0)
SPACE = Field("space", "full: on each module's dense update (PEFT's *_svd; needs --rank); core: on the "
              "module's shared low-rank core, never dense", kind="str", default="full", choices=SPACES)
MAJORITY = Field("majority", "sign election: total (sign of the summed values, the paper's) or frequency "
                 "(sign of the count of signs)", kind="str", default="total", choices=MAJORITIES)
SEED = Field("seed", "seed of DARE's random drops (recorded; module m draws from sha256(seed, m))", kind="int",
             default=0, low=0)


KEEP_BYTES = 256 * 2**20  # float64 bytes of a module's models' dense rows kept between the two passes


class Elementwise(Method):
    """An element-wise merge of the models' updates, in full or core space (see the module docstring).

    Class attributes:
        drop (str): ``magnitude`` (keep the top ``density`` by magnitude) or ``random`` (DARE).
        combine (str): ``sum`` (weighted sum) or ``ties`` (sign election and disjoint mean).
    """

    operands = ("models",)
    space = "dense"
    fields = (DENSITY, SPACE)
    drop = "magnitude"
    combine = "sum"

    def space_for(self, params: dict) -> str:
        return "dense" if params.get("space", "full") == "full" else "core"

    def validate(self, recipe) -> list[Problem]:
        p = []
        density = recipe.params.get("density")
        if density is not None and density <= 0.0:
            p.append(Problem("{density=}{}: a share in (0, 1] of the entries to keep, e.g. 0.5", repr(density)))
        lacking = [str(e.get("model")) for e in recipe.models or [] if e.get("density") is None]
        if density is None and lacking and "density" not in recipe.given:  # a given but invalid one is reported
            p.append(Problem("{method=}{}: needs {density} (e.g. --density 0.5), or a density for each model "
                             "(missing for {})", self.name, ", ".join(lacking)))
        if self.space_for(recipe.params) == "dense" and "rank" not in recipe.given:
            p.append(Problem("{method=}{} in space full: its dense result has full rank; pass {rank} (e.g. --rank "
                             "32, the inputs' rank, as PEFT's *_svd does; or energy:0.9), or use space core",
                             self.name))
        return p

    def module(self, x, params):
        import torch

        from ..linalg.dense import Dense
        from ..linalg.streamed import block_rows, streamed_merge
        from ..linalg.subspace import InSpan

        d = [di if di is not None else params["density"] for di in x.densities]
        kw = {"majority": params.get("majority", "total"), "mask_dtype": torch.float32,
              "generator": generator(params["seed"], x.name) if self.drop == "random" else None}
        n, (rows, cols) = len(x.models), x.models[0].shape
        if self.space_for(params) == "dense":
            Qb, Qa = x.models[0].space.bases()
            kept = {} if 8 * n * rows * cols <= KEEP_BYTES else None

            def task_rows(i: int, r0: int, r1: int):
                blk = kept.get((i, r0)) if kept is not None else None
                if blk is None:
                    blk = (Qb[r0:r1] @ x.models[i].C) @ Qa.T
                    if kept is not None:
                        kept[(i, r0)] = blk
                return blk

            D = streamed_merge(task_rows, n, (rows, cols), x.weights, d, self.drop, self.combine,
                               rows_per_block=block_rows(n, cols), device=Qb.device, **kw)
            return Dense(D)
        X = torch.stack([m.C for m in x.models])
        floor = sum(abs(w) * m.floor for w, m in zip(x.weights, x.models))
        U, V = principal_bases(X)
        Y = U.T @ X @ V
        Z = streamed_merge(lambda i, r0, r1: Y[i, r0:r1], n, tuple(Y.shape[1:]), x.weights, d, self.drop,
                           self.combine, rows_per_block=max(1, Y.shape[1]), device=Y.device, **kw)
        return InSpan(U @ Z @ V.T, x.models[0].space, floor)


PRINCIPAL_RTOL = 1e-12  # singular values below this share of the largest span no direction of the updates


def principal_bases(X):
    """``(U, V)``: left singular vectors of ``[X_1 .. X_n]`` and right ones of ``[X_1; ..; X_n]`` with
    singular values above ``PRINCIPAL_RTOL`` of the largest (float64, from SVDs of p x nq and np x q).

    Args:
        X (Tensor): (n, p, q) the models' cores of one module.

    Returns:
        U (p, kb), V (q, ka), orthonormal columns (kb = ka = 0 for an all-zero stack).
    """
    import torch

    n, p, q = X.shape
    U, Sb, _ = torch.linalg.svd(X.permute(1, 0, 2).reshape(p, n * q), full_matrices=False)
    _, Sa, Vh = torch.linalg.svd(X.reshape(n * p, q), full_matrices=False)
    kb = int((Sb > PRINCIPAL_RTOL * Sb[0]).sum()) if Sb.numel() and Sb[0] > 0 else 0
    ka = int((Sa > PRINCIPAL_RTOL * Sa[0]).sum()) if Sa.numel() and Sa[0] > 0 else 0
    return U[:, :kb], Vh[:ka].T


def generator(seed: int, module: str):
    """A CPU generator for one module, seeded by ``merge_kernels.module_seed(seed, module)``."""
    import torch

    from ..linalg.merge_kernels import module_seed

    return torch.Generator().manual_seed(module_seed(seed, module))
