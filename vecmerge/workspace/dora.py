"""DoRA adapters read as their effective update: ``m * (W + s B A) / ||W + s B A||_c - W`` per module.

DoRA (Liu et al., ICML 2024, arXiv 2402.09353; PEFT's ``tuners/lora/dora.py``) writes a linear layer's weight
as a learned magnitude times a direction: ``W' = diag(m / n) (W + s B A)`` with ``n`` the norm of each output
row of ``W + s B A`` (PEFT's ``get_weight_norm``: ``||.||`` over dim 1 of the (out, in) weight; the paper's
"column norm" of the transposed weight). So a DoRA module's update is not ``s B A`` but

    DeltaW = diag(m / n) (W + s B A) - W = diag(m / n - 1) W + diag(m / n) s B A,

which depends on the base weight ``W`` and has full rank in general: merging DoRA adapters as if their
update were ``s B A`` is off by ``diag(m / n - 1) (W + s B A)`` (PEFT #3608 reports 2.6-13.9%).

Here each module's ``DeltaW`` is formed exactly in float64 from the base model's weight, one module at a
time, and held as the factors ``(DeltaW, I)`` (or ``(I, DeltaW)``, whichever rank ``min(out, in)`` is smaller
side): exact, so every method merges it like any update and the output's rank cut reports its exact error.
The cost is memory: a DoRA input takes about ``8 out in`` bytes per module for the whole run (its factors),
and its cores as much again.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..errors import AdapterError
from ..io.model_folder import ModelFolder
from ..linalg.lowrank import LowRank, f64
from ..peft.adapter import Adapter


def dora_update(W: torch.Tensor, lora: LowRank, m: torch.Tensor) -> torch.Tensor:
    """``diag(m / n) (W + s B A) - W`` with ``n`` the row norms of ``W + s B A`` (float64, (out, in)).

    Args:
        W (Tensor): (out, in) the base weight. lora (LowRank): ``s B A``. m (Tensor): (out,) the magnitudes.
    """
    W = f64(W)
    V = W + lora.dense().to(W.device)
    n = torch.linalg.vector_norm(V, dim=1)
    if not bool((n > 0).all()):
        raise AdapterError("DoRA: a row of W + sBA is zero, so its direction is undefined")
    return (f64(m).to(W.device) / n)[:, None] * V - W


def as_factors(D: torch.Tensor) -> LowRank:
    """A dense update as exact factors of rank ``min(out, in)``: ``(D, I_in)`` or ``(I_out, D)``."""
    out, inn = D.shape
    if inn <= out:
        return LowRank(D, torch.eye(inn, dtype=D.dtype, device=D.device), 1.0)
    return LowRank(torch.eye(out, dtype=D.dtype, device=D.device), D, 1.0)


def dora_modules(adapter: Adapter, base: Path | None, device=None) -> dict[str, LowRank]:
    """Every module of a DoRA adapter as the exact factors of its effective update (see the module docstring).

    Args:
        adapter (Adapter): opened with ``dora=True``. base (Path): the base model folder it was trained on.
        device: where the factors go (default cpu).
    """
    folder = ModelFolder(base)
    out = {}
    try:
        for mod in adapter.modules:
            spec, name = adapter.specs[mod], f"{mod}.weight"
            if name not in folder.tensors:
                raise AdapterError(f"{adapter.path}: DoRA module {mod}: the base model {base} has no tensor {name}; "
                                   "pass the base model the adapter was trained on (--base-model)")
            if tuple(folder.info(name).shape) != tuple(spec.shape):
                raise AdapterError(f"{adapter.path}: DoRA module {mod}: base weight {tuple(folder.info(name).shape)},"
                                   f" the adapter's update {tuple(spec.shape)}; pass the base model it was trained on")
            W = folder.read(name).to(device=device or "cpu")
            out[mod] = as_factors(dora_update(W, adapter.factors(mod, device), adapter.magnitude(mod).to(W.device)))
    finally:
        folder.close()
    return out
