"""What breadcrumbs and DELLA share: mergekit's generalized task arithmetic on the models' updates.

mergekit 0.1.5 defines them as configurations of one method (``linalg/gta.py``): a sparsification of each
model's update (breadcrumbs: drop the smallest and the ``gamma`` largest entries; DELLA: drop entries at
random with probabilities rising with their magnitude's rank), an optional L1 rescale (``rescale``), the
weights, an optional sign consensus (``*_ties``, ``della``), ``normalize`` and ``lambda``. Each option keeps
mergekit's name and default. Like TIES they run in ``space: full`` (each module's dense update, one module
at a time, cut to ``rank``) or ``core`` (the module's principal bases, never dense; see ``elementwise``).
"""

from __future__ import annotations

from ..errors import Problem
from .base import Field
from .elementwise import (
    DENSITY,
    LAMBDA,
    NORMALIZE_HELP,
    RESCALE_HELP,
    SEED,
    SPACE,
    Elementwise,
    generator,
    module_densities,
)

GAMMA = Field("gamma", "breadcrumbs: share of each model's largest entries dropped as outliers (mergekit's "
              "default 0.01)", default=0.01, low=0.0, high=1.0)
EPSILON = Field("epsilon", "DELLA: keep probabilities run from density - epsilon (smallest entry of a row) to "
                "density + epsilon (largest); mergekit's default 0.15", default=0.15, low=0.0, high=1.0)


def normalize_field(default: bool) -> Field:
    return Field("normalize", NORMALIZE_HELP, kind="bool", default=default)


def rescale_field(default: bool) -> Field:
    return Field("rescale", RESCALE_HELP, kind="bool", default=default)


class Generalized(Elementwise):
    """A merge of mergekit's generalized task arithmetic (see the module docstring).

    Class attributes:
        sparsify (str): ``outliers`` (breadcrumbs) or ``della``. consensus (str): ``none`` or ``sum``.
    """

    sparsify = "outliers"
    consensus = "none"

    def validate(self, recipe) -> list:
        p: list[Problem | str] = list(super().validate(recipe))
        eps = recipe.params.get("epsilon")
        if self.sparsify == "della" and eps is not None:
            ds = [e.get("density") for e in recipe.models or []] + [recipe.params.get("density")]
            for d in sorted({d for d in ds if d is not None and d < 1.0}):
                if not (0.0 < d - eps and d + eps < 1.0):
                    p.append(f"method={self.name}: density {d:g} with epsilon {eps:g} gives keep probabilities "
                             f"outside (0, 1); use an epsilon below {min(d, 1.0 - d):g}")
        return p

    def merge_tasks(self, t, x, params):
        from ..linalg.gta import Scheme, gta_merge

        scheme = Scheme(self.sparsify, "l1" if params.get("rescale") else "none", self.consensus,
                        bool(params.get("normalize")), params.get("lambda", 1.0), params.get("gamma", 0.0),
                        params.get("epsilon", 0.0))
        gen = generator(params["seed"], x.name) if self.sparsify == "della" else None
        return gta_merge(t.rows, t.n, t.shape, x.weights, module_densities(x, params), scheme, generator=gen,
                         rows_per_block=t.block, device=t.device)


BREADCRUMBS_FIELDS = (DENSITY, GAMMA, SPACE, normalize_field(False), rescale_field(False), LAMBDA)
DELLA_FIELDS = (DENSITY, EPSILON, SPACE, SEED, rescale_field(True), LAMBDA)
