"""What TIES, DARE and magnitude pruning share: their fields, their checks, and where they run.

Each is an element-wise merge ``kernel(X, w, d)`` of ``merge_kernels`` on a stack ``X`` of the models'
updates of one module, in one of two spaces:

    space: full    the dense updates DeltaW_i = Qb C_i Qa^T, one module at a time; the result is cut to ``rank``
    space: core    U^T DeltaW_i V in the module's principal bases (Core Space merging, Panariello et al. 2025),
                   lifted back by U . V^T: never dense, exact at ``rank: exact``

With ``normalize`` set, TIES and DARE follow mergekit's convention (``linalg/gta.py``); unset, PEFT's. Both
run ``streamed.streamed_merge`` (full space: one block of rows of every model at a time). Every model's
density is its own ``density`` in ``models``, else the recipe's. Torch is imported inside the methods.
Why core space is gauge- and order-free, and the memory rule: docs/design/methods.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

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


NORMALIZE_HELP = ("mergekit's normalize: divide the merged entries by the sum of the (agreeing) models' weights. "
                  "Defaults as mergekit's: true for della; false for task_arithmetic, breadcrumbs, "
                  "breadcrumbs_ties, della_linear. ties, dare_ties, dare_linear: unset by default, which is "
                  "PEFT's rule (the sign elected on the unweighted tasks, the agreeing weighted entries divided "
                  "by their COUNT); given, mergekit's rule (the sign elected on the weighted tasks; true divides "
                  "by the agreeing WEIGHTS, false sums). mergekit's own default is true for ties, false for "
                  "dare_ties and dare_linear; the two rules agree only when every weight is 1 (docs/METHODS.md)")
NORMALIZE = Field("normalize", NORMALIZE_HELP, kind="bool")
RESCALE_HELP = ("mergekit's rescale: scale each sparsified update back to its L1 norm (true) or not at all (false). "
                "Defaults as mergekit's: true for della, della_linear; false for breadcrumbs, breadcrumbs_ties. "
                "ties, dare_ties, dare_linear: unset by default (DARE's 1/density, PEFT's; ties none); given, needs "
                "normalize (mergekit's rule). merge --config fills mergekit's default: true for dare_*, false for "
                "ties")
RESCALE = Field("rescale", RESCALE_HELP, kind="bool")
LAMBDA = Field("lambda", "mergekit's lambda: the merged update times this", default=1.0)


KEEP_BYTES = 256 * 2**20  # float64 bytes of a module's models' dense rows kept between the two passes


class Elementwise(Method):
    """An element-wise merge of the models' updates, in full or core space (see the module docstring).

    Class attributes:
        drop (str): ``magnitude`` (keep the top ``density`` by magnitude) or ``random`` (DARE).
        combine (str): ``sum`` (weighted sum) or ``ties`` (sign election and disjoint mean).
    """

    operands = ("models",)
    space = "dense"
    fields: ClassVar[tuple] = (DENSITY, SPACE)
    drop = "magnitude"
    combine = "sum"

    def space_for(self, params: dict) -> str:
        return "dense" if params.get("space", "full") == "full" else "core"

    def validate(self, recipe) -> list:
        p = []
        density = recipe.params.get("density")
        if density is not None and density <= 0.0:
            p.append(Problem("{density=}{}: a share in (0, 1] of the entries to keep, e.g. 0.5", repr(density)))
        lacking = [str(e.get("model")) for e in recipe.models or [] if e.get("density") is None]
        if density is None and lacking and "density" not in recipe.given:  # a given but invalid one is reported
            p.append(Problem("{method=}{}: needs {density} (e.g. --density 0.5), or a density for each model "
                             "(missing for {})", self.name, ", ".join(lacking)))
        if recipe.params.get("rescale") is not None and recipe.params.get("normalize") is None:
            p.append(Problem("{rescale}: mergekit's option, taken with mergekit's rule: give {normalize} too (true "
                             "or false; mergekit's default for {}: {})", self.name,
                             "true" if self.name == "ties" else "false"))
        if self.space_for(recipe.params) == "dense" and "rank" not in recipe.given:
            p.append(Problem("{method=}{} in space full: its dense result has full rank; pass {rank} (the inputs' "
                             "rank, as PEFT's *_svd does, or energy:0.9), or use space core (exact on the inputs' "
                             "shared basis, no rank needed)", self.name))
        return p

    def module(self, x, params):
        t = tasks_of(x, self.space_for(params) == "dense")
        return t.lift(self.merge_tasks(t, x, params))

    def merge_tasks(self, t: Tasks, x, params):
        """The merged (rows, cols) matrix of the tasks ``t`` (PEFT's kernels; mergekit's with ``normalize``)."""
        import torch

        from ..linalg.gta import Scheme, gta_merge
        from ..linalg.streamed import block_rows, streamed_merge

        d = module_densities(x, params)
        gen = generator(params["seed"], x.name) if self.drop == "random" else None
        lam = params.get("lambda", 1.0)
        if params.get("normalize") is not None:  # mergekit's convention: see NORMALIZE and RESCALE
            consensus = "none" if self.combine == "sum" else {"total": "sum", "frequency": "count"}[
                params.get("majority", "total")]
            rescale = {None: "inverse" if self.drop == "random" else "none", True: "l1", False: "none"}[
                params.get("rescale")]
            scheme = Scheme("magnitude" if self.drop == "magnitude" else "random", rescale, consensus,
                            params["normalize"], lam)
            return gta_merge(t.rows, t.n, t.shape, x.weights, d, scheme, generator=gen,
                             rows_per_block=t.block, device=t.device)
        out = streamed_merge(t.rows, t.n, t.shape, x.weights, d, self.drop, self.combine,
                             majority=params.get("majority", "total"), mask_dtype=torch.float32, generator=gen,
                             rows_per_block=t.block or block_rows(t.n, t.shape[1]), device=t.device)
        return out * lam if lam != 1.0 else out


def module_densities(x, params) -> list:
    """Each model's density in this module: its own ``density`` in ``models``, else the recipe's."""
    return [di if di is not None else params.get("density", 1.0) for di in x.densities]


@dataclass(frozen=True)
class Tasks:
    """A module's models as task matrices for an element-wise kernel, and the way back to an update.

    Args:
        rows (callable): ``(i, r0, r1) -> Tensor``, rows of task i. n (int): tasks. shape (tuple): (rows, cols).
        device: where they live. block (int | None): rows per block (None: the kernel's default).
        space (Subspace): the module's basis. U, V (Tensor | None): core space's principal bases (None: full).
        floor (float): the round-off scale of the models' sum.
    """

    rows: Any
    n: int
    shape: tuple
    device: Any
    block: int | None
    space: Any
    U: Any = None
    V: Any = None
    floor: float = 0.0

    def lift(self, Z):
        """The merged matrix as the module's update: ``Dense(Z)`` (full space) or ``InSpan(U Z V^T)`` (core)."""
        from ..linalg.dense import Dense
        from ..linalg.subspace import InSpan

        return Dense(Z) if self.U is None else InSpan(self.U @ Z @ self.V.T, self.space, self.floor)


def tasks_of(x, full: bool) -> Tasks:
    """Module x's models as tasks: in full space the dense updates ``Qb C_i Qa^T``, formed on demand (their
    rows kept between passes when they fit in ``KEEP_BYTES``); in core space ``U^T C_i V`` (see the module
    docstring), all in one block.

    Args:
        x (ModuleOperands): the module's operands. full (bool): full (dense) space, else core space.
    """
    import torch

    n, (rows, cols) = len(x.models), x.models[0].shape
    space = x.models[0].space
    floor = sum(abs(w) * m.floor for w, m in zip(x.weights, x.models))
    if full:
        Qb, Qa = space.bases()
        kept: dict | None = {} if 8 * n * rows * cols <= KEEP_BYTES else None

        def task_rows(i: int, r0: int, r1: int):
            blk = kept.get((i, r0, r1)) if kept is not None else None
            if blk is None:
                blk = (Qb[r0:r1] @ x.models[i].C) @ Qa.T
                if kept is not None:
                    kept[(i, r0, r1)] = blk
            return blk

        return Tasks(task_rows, n, (rows, cols), Qb.device, None, space, floor=floor)
    X = torch.stack([m.C for m in x.models])
    U, V = principal_bases(X)
    Y = U.T @ X @ V
    return Tasks(lambda i, r0, r1: Y[i, r0:r1], n, tuple(Y.shape[1:]), Y.device, max(1, Y.shape[1]), space, U, V,
                 floor)


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
