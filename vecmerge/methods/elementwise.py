"""What TIES, DARE and magnitude pruning share: their fields, their checks, and where they run.

Each is an element-wise merge ``kernel(X, w, d)`` of ``merge_kernels`` on a stack ``X`` of the models'
updates of one module, either

- ``space: full``: the models' dense updates ``DeltaW_i`` (out x in), formed one module at a time from
  the module's cores (``Qb C_i Qa^T``): the method as the papers and PEFT's ``*_svd`` define it; its
  result has full rank, so it is cut to ``rank`` (required) by a randomized SVD with an exact error;
- ``space: core``: the models' cores ``C_i`` (p x q) in the module's shared basis (Core Space merging,
  Panariello et al. 2025): never dense, exact at ``rank: exact`` (rank <= p).

Every model's density is its own ``density`` in ``models``, else the recipe's ``density``. Imports of
torch happen inside the methods, so ``vecmerge --help`` stays fast.
"""

from __future__ import annotations

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


class Elementwise(Method):
    """An element-wise merge of the models' updates, in full or core space (see the module docstring)."""

    operands = ("models",)
    space = "dense"
    fields = (DENSITY, SPACE)

    def space_for(self, params: dict) -> str:
        return "dense" if params.get("space", "full") == "full" else "core"

    def validate(self, recipe) -> list[str]:
        p = []
        density = recipe.params.get("density")
        if density is not None and density <= 0.0:
            p.append(f"density={density!r}: a share in (0, 1] of the entries to keep, e.g. 0.5")
        lacking = [str(e.get("model")) for e in recipe.models or [] if e.get("density") is None]
        if density is None and lacking:
            p.append(f"method={self.name}: needs density (e.g. --density 0.5), or a density for each model "
                     f"(missing for {', '.join(lacking)})")
        if self.space_for(recipe.params) == "dense" and "rank" not in recipe.given:
            p.append(f"method={self.name} in space full: its dense result has full rank; pass rank (e.g. --rank "
                     "32, the inputs' rank, as PEFT's *_svd does; or energy:0.9), or use space core")
        return p

    def kernel(self, X, w, densities: list, params: dict, module: str):
        """The merge of the stack ``X`` (n, rows, cols) with weights ``w`` (n,): a (rows, cols) tensor."""
        raise NotImplementedError

    def module(self, x, params):
        import torch

        from ..dense import Dense
        from ..subspace import InSpan

        d = [di if di is not None else params["density"] for di in x.densities]
        if self.space_for(params) == "dense":
            X = torch.stack([m.dense() for m in x.models])
            return Dense(self.kernel(X, list(x.weights), d, params, x.name))
        X = torch.stack([m.C for m in x.models])
        floor = sum(abs(w) * m.floor for w, m in zip(x.weights, x.models))
        return InSpan(self.kernel(X, list(x.weights), d, params, x.name), x.models[0].space, floor)


def generator(seed: int, module: str):
    """A CPU generator for one module, seeded by ``merge_kernels.module_seed(seed, module)``."""
    import torch

    from ..merge_kernels import module_seed

    return torch.Generator().manual_seed(module_seed(seed, module))
