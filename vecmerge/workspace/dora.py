"""DoRA adapters read as their effective update: ``m * (W + s B A) / ||W + s B A||_c - W`` per module.

DoRA (Liu et al., ICML 2024; PEFT's ``tuners/lora/dora.py``) writes ``W' = diag(m / n) (W + s B A)``, ``n`` the
norm of each output row of ``W + s B A``, so a module's update is

    DeltaW = diag(m / n) (W + s B A) - W = diag(m / n - 1) W + diag(m / n) s B A

which depends on the base weight and has full rank in general. Each module's ``DeltaW`` is formed exactly in
float64 from the base model's weight and held as the factors ``(DeltaW, I)`` or ``(I, DeltaW)`` (the smaller
side), so every method merges it like any update. Memory: about ``8 out in`` bytes per module, and its cores
as much again. What merging it as ``s B A`` would cost: docs/design/workspace.md.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..errors import AdapterError
from ..io.model_folder import ModelFolder
from ..linalg.lowrank import LowRank, f64
from ..peft.adapter import Adapter

# A layer's outputs reach m_i |x|; products of two of them (attention's q.k, the MLP's gate * up) overflow
# float32 above its square root, 1.84e19 (trained magnitudes are near the weight-row norms, ~1).
MAGNITUDE_MAX = float(torch.finfo(torch.float32).max) ** 0.5


def dora_update(W: torch.Tensor, lora: LowRank, m: torch.Tensor) -> torch.Tensor:
    """``diag(m / n) (W + s B A) - W`` with ``n`` the row norms of ``W + s B A`` (float64, (out, in)).

    Args:
        W (Tensor): (out, in) the base weight. lora (LowRank): ``s B A``. m (Tensor): (out,) the magnitudes.
    """
    W = f64(W)
    V = W + lora.dense().to(W.device)
    n = torch.linalg.vector_norm(V, dim=1)
    if not bool(torch.isfinite(n).all()):
        raise AdapterError("DoRA: a row of W + sBA is not finite (NaN or inf in W or in the factors)")
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
            m = adapter.magnitude(mod)
            top = float(m.abs().max()) if m.numel() else 0.0
            if top > MAGNITUDE_MAX:
                raise AdapterError(f"{adapter.path}: DoRA module {mod}: a magnitude of {top:.3g} is above "
                                   f"{MAGNITUDE_MAX:.3g} (the square root of float32's largest number), so the "
                                   "model's products of its outputs overflow to non-finite logits; the adapter is "
                                   "broken, save it again from training")
            W = folder.read(name).to(device=device or "cpu")
            if not bool(torch.isfinite(W).all()):
                bad = int((~torch.isfinite(W)).sum())
                kind = "NaN" if bool(torch.isnan(W).any()) else "inf"
                raise AdapterError(f"{adapter.path}: DoRA module {mod}: the base model's tensor {name} holds {bad} "
                                   f"non-finite value(s) ({kind}) in {base}; repair the base model's weights")
            out[mod] = as_factors(dora_update(W, adapter.factors(mod, device), m.to(W.device)))
    finally:
        folder.close()
    return out
