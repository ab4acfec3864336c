"""``TaskVector``: ``{module: LowRank}`` with the algebra lifted over modules, and module alignment.

A task vector is the whole-model update of an adapter (or of an expression of adapters). Global
quantities add over modules: ``<x, y> = sum_m <x_m, y_m>``, ``||x||^2 = sum_m ||x_m||^2``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..errors import AlignmentError, few
from ..linalg.lowrank import LowRank, combine
from ..peft.adapter import Adapter


@dataclass
class TaskVector:
    """Per-module low-rank updates sharing one module layout.

    Args:
        modules (dict[str, LowRank]): module name -> update, (out, in) in the LoRA layout.
        specs (dict[str, ModuleSpec]): module name -> layout (shape, kind, transposed) for writing.
        biases (dict[str, Tensor]): a ``lora_bias`` adapter's bias updates ``scale * lora_B.bias`` (float64),
            per module that has one; the algebra below is over ``modules`` only (``pipeline.bias`` combines them).
    """

    modules: dict
    specs: dict
    biases: dict = field(default_factory=dict)

    @classmethod
    def from_adapter(cls, adapter: Adapter, device=None) -> TaskVector:
        """Read every module of ``adapter`` (stored dtype, scale attached), onto ``device`` (default: cpu)."""
        return cls({m: adapter.factors(m, device) for m in adapter.modules}, dict(adapter.specs),
                   {m: adapter.bias(m) for m in adapter.bias_keys})

    def __getitem__(self, name: str) -> LowRank:
        return self.modules[name]

    def __iter__(self):
        return iter(self.modules)

    def __len__(self) -> int:
        return len(self.modules)

    def names(self) -> list[str]:
        return list(self.modules)

    def map(self, fn) -> TaskVector:
        """Apply ``fn(name, LowRank) -> LowRank`` to every module."""
        return TaskVector({m: fn(m, x) for m, x in self.modules.items()}, self.specs)

    def __mul__(self, c: float) -> TaskVector:
        return self.map(lambda _, x: x * c)

    __rmul__ = __mul__

    def __neg__(self) -> TaskVector:
        return self * -1.0

    def __add__(self, other: TaskVector) -> TaskVector:
        return linear_combination([(1.0, self), (1.0, other)])

    def __sub__(self, other: TaskVector) -> TaskVector:
        return linear_combination([(1.0, self), (-1.0, other)])

    def inner(self, other: TaskVector) -> float:
        """``sum_m <x_m, y_m>_F`` over the shared modules."""
        return sum(self[m].inner(other[m]) for m in self.modules)

    def module_norms(self) -> dict[str, float]:
        """``{m: ||x_m||_F}``, each by the QR core (stable for differences)."""
        return {m: x.norm() for m, x in self.modules.items()}

    def norm(self) -> float:
        """``sqrt(sum_m ||x_m||^2)``."""
        return math.sqrt(sum(n * n for n in self.module_norms().values()))

    def cosine(self, other: TaskVector) -> float:
        nx, ny = self.norm(), other.norm()
        return 0.0 if nx == 0 or ny == 0 else self.inner(other) / (nx * ny)


def align(vectors: list[TaskVector], labels: list[str], allow_missing: bool = False) -> list[str]:
    """Check that ``vectors`` can be combined and return the union of module names, in order.

    Raises AlignmentError listing modules present in some and missing in others (unless
    ``allow_missing``, where a missing module counts as zero), and modules whose shapes or layouts
    differ (adapters of different base models).
    """
    names: list[str] = []
    seen = set()
    for v in vectors:
        for m in v.modules:
            if m not in seen:
                seen.add(m)
                names.append(m)
    for m in names:
        owners = [(lab, v.specs[m]) for lab, v in zip(labels, vectors) if m in v.specs]
        ref_label, ref = owners[0]
        for lab, spec in owners[1:]:
            if spec.shape != ref.shape or spec.transposed != ref.transposed:
                raise AlignmentError(
                    f"module {m}: {lab} has shape {spec.weight_shape} but {ref_label} has {ref.weight_shape}; "
                    "these adapters are for different base models and cannot be combined"
                )
            if spec.experts != ref.experts:
                raise AlignmentError(
                    f"module {m}: an expert of {spec.experts} in {lab} but of {ref.experts} in {ref_label}; "
                    "these adapters are for different base models and cannot be combined"
                )
    for (la, va), (lb, vb) in zip(zip(labels, vectors), list(zip(labels, vectors))[1:]):
        if va.modules and vb.modules and not set(va.modules) & set(vb.modules):
            raise AlignmentError(f"{la} and {lb} share no module ({next(iter(va.modules))} vs "
                                 f"{next(iter(vb.modules))}); they are adapters of different base models")
    if not allow_missing:
        for lab, v in zip(labels, vectors):
            missing = [m for m in names if m not in v.modules]
            if missing:
                shown = few(missing, 5)
                raise AlignmentError(
                    f"{lab} lacks {len(missing)} module(s) the others have: {shown}; "
                    "pass --allow-missing to treat them as zero"
                )
    return names


def linear_combination(terms: list[tuple[float, TaskVector]], labels: list[str] | None = None,
                       allow_missing: bool = False) -> TaskVector:
    """Exact ``sum_i c_i x_i`` per module by stacking factors (rank adds up; no dense matrix).

    Args:
        terms (list[tuple[float, TaskVector]]): coefficients and task vectors.
        labels (list[str] | None): names for error messages.
        allow_missing (bool): treat modules absent from a term as zero.
    """
    labels = labels or [f"term {i + 1}" for i in range(len(terms))]
    vecs = [v for _, v in terms]
    names = align(vecs, labels, allow_missing)
    specs = {}
    out = {}
    for m in names:
        spec = next(v.specs[m] for v in vecs if m in v.specs)
        specs[m] = spec
        parts = [(c, v.modules[m]) for c, v in terms if m in v.modules]
        out[m] = combine(parts)
    return TaskVector(out, specs)

