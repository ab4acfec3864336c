"""A candidate's update as exact concatenated LoRA factors, for probe's hooks: nothing written, no SVD.

Per module (``space.py``: ``D'``, ``mult``), with the backbone ``s_b B_b A_b`` and ``D'_m = s B (A - (A U) U^T)``::

    alpha    = t * ||backbone|| / ||D'||                       (global Frobenius norms, as ``--trust t``)
    update_m = [s_b B_b, alpha s B] @ [A_b ; A - (A U) U^T]     (one LoRA of rank r_b + r, scale 1)

which is what the pipeline writes for the candidate's ``project`` recipe at rank exact (tested). ``U`` comes from
the protected sets' inputs captured ONCE at the backbone (``probe.capture``), one decomposition per distinct input,
each energy cut from it, shared by every candidate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from ..analysis.protect import decompose_factor, decompose_gram, energy_cut
from ..errors import RecipeError
from ..linalg.lowrank import LowRank, combine
from ..probe.capture import Grams
from ..probe.hooks import Update
from ..workspace.taskvector import TaskVector
from .space import Candidate


@dataclass
class Factors:
    """What every candidate of a search shares: the backbone, the directions, the Grams, the cached bases.

    Args:
        backbone (TaskVector): the base expression. dirs (list[TaskVector]): each direction expression.
        grams (Grams | None): the protected sets' Grams at the backbone (None: no protection).
        protect (list[str]): the protected sets' names.
    """

    backbone: TaskVector
    dirs: list
    grams: Grams | None = None
    protect: list = field(default_factory=list)
    _bases: dict = field(default_factory=dict)
    _shared: dict = field(default_factory=dict)
    _norm: float | None = None

    @property
    def modules(self) -> list[str]:
        return list(self.backbone.modules)

    @property
    def backbone_norm(self) -> float:
        """``||backbone||`` over all modules (computed once)."""
        if self._norm is None:
            self._norm = math.sqrt(sum(x.norm() ** 2 for x in self.backbone.modules.values()))
        return self._norm

    def basis(self, module: str, energy: float) -> torch.Tensor:
        """``U`` of ``module`` at ``energy``: the protected inputs' span, float64, from one decomposition per
        distinct input, kept for the whole search (``probe.capture.Grams.basis``'s rule: the stacked rows' SVD where
        every set kept rows or a sketch, else the summed Gram's eigh; ``Grams.basis`` keeps only a few)."""
        if module not in self._bases:
            if self.grams is None:
                raise ValueError("no Grams captured")  # a caller's error: protection without a capture
            g = self.grams
            key = tuple(id(g.by_set[k][module]) for k in self.protect)
            if key not in self._shared:
                rows = [g.by_set[k][module].factor() for k in self.protect]
                self._shared[key] = (decompose_factor(torch.cat(rows)) if rows and all(r is not None for r in rows)
                                     else decompose_gram(g.total(self.protect, module)))
            self._bases[module] = self._shared[key]
        w, V = self._bases[module]
        return energy_cut(w, V, energy)[0]

    def decompose(self, modules) -> None:
        """Every module's eigendecomposition now (a search's setup), so that no candidate pays for one."""
        for m in modules:
            self.basis(m, 1.0)


def linear_modules(factors: Factors) -> list[str]:
    """The modules a protected step projects: linear ones (``probe.capture`` reads their inputs)."""
    return [m for m in factors.modules if factors.backbone.specs[m].kind == "linear"]


def direction(c: Candidate, factors: Factors, protected: bool = True) -> dict[str, LowRank]:
    """``D'_m`` of every stepped module (module docstring; ``D_m`` when not ``protected``), float64 factors;
    modules with no step left out."""
    weights = [c.params.get(f"w{i}", 1.0) for i in range(len(factors.dirs))]
    energy = c.params.get("energy", 0.0) if factors.grams is not None and protected else 0.0
    out = {}
    for m, mult in c.multipliers.items():
        terms = [(w * mult, d.modules[m]) for w, d in zip(weights, factors.dirs) if w * mult != 0.0]
        if not terms:
            continue
        d = combine(terms)
        if energy and factors.backbone.specs[m].kind == "linear" and d.norm() > 0.0:
            U = factors.basis(m, energy).to(d.A.dtype)
            d = LowRank(d.B, d.A - (d.A @ U) @ U.T, d.scale)
        out[m] = d
    return out


@dataclass(frozen=True)
class Built:
    """A candidate's hooks and its step: ``updates`` (module -> Update), ``alpha``, ``step`` (relative norm),
    ``kept_direction`` (``||D'|| / ||D||``, 1 without protection)."""

    updates: dict
    alpha: float
    step: float
    kept_direction: float


def build(c: Candidate, factors: Factors, *, device="cpu", dtype=torch.float32) -> Built:
    """The candidate's per-module ``Update`` (backbone and step concatenated, the scales folded into B).

    Args:
        c (Candidate): a candidate without a ``problem``. factors (Factors): the search's shared factors.
        device: where the factors go. dtype: the model's compute dtype.
    """
    d = direction(c, factors)
    norm = math.sqrt(sum(x.norm() ** 2 for x in d.values()))
    if norm == 0.0:
        raise RecipeError([f"candidate {c.sha256[:12]}: the direction is zero after its multipliers and "
                           "protection; nothing to step along"])
    alpha = c.params["trust"] * factors.backbone_norm / norm
    updates = {}
    for m in factors.modules:
        b = factors.backbone.modules[m]
        parts = [(b.B * b.scale, b.A)] + ([(d[m].B * (d[m].scale * alpha), d[m].A)] if m in d else [])
        B = torch.cat([p[0].to(torch.float64) for p in parts], 1)
        A = torch.cat([p[1].to(torch.float64) for p in parts], 0)
        updates[m] = Update(factors.backbone.specs[m].kind, A.to(device=device, dtype=dtype),
                            B.to(device=device, dtype=dtype), 1.0)
    whole = math.sqrt(sum(x.norm() ** 2 for x in direction(c, factors, protected=False).values()))
    return Built(updates, alpha, alpha * norm / factors.backbone_norm if factors.backbone_norm else math.inf,
                 norm / whole if whole else 1.0)


def backbone_updates(factors: Factors, *, device="cpu", dtype=torch.float32) -> dict[str, Update]:
    """The backbone alone as hooks (the reference every change is measured from, and the capture's)."""
    return {m: Update(factors.backbone.specs[m].kind, b.A.to(device=device, dtype=dtype),
                      (b.B * b.scale).to(device=device, dtype=dtype), 1.0)
            for m, b in factors.backbone.modules.items()}


def dense(c: Candidate, factors: Factors) -> dict[str, torch.Tensor]:
    """Each module's whole update ``B @ A`` (float64, the LoRA layout): for tests and checks only."""
    return {m: u.B.double() @ u.A.double() for m, u in build(c, factors, dtype=torch.float64).updates.items()}
