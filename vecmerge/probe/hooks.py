"""An adapter's exact update on a loaded transformers base, switched in and out by forward hooks.

For each targeted module, with ``A`` (r, in), ``B`` (out, r) and scale ``s`` (``Adapter.factors``), the hook
adds exactly what PEFT's LoRA layer adds, in the same order of operations::

    linear, Conv1D     y = base(x) + (x A^T) B^T * s
    embedding          y = base(ids) + embedding(ids, A^T) B^T * s

The base weights are never written: ``LoraHooks.use`` swaps which factors the hooks read, and removing the
hooks leaves the model bit for bit as loaded. Parameters adapted through ``target_parameters`` are refused.
Why hooks rather than ``W += s B A``, and their cost: docs/design/probe.md.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..errors import AlignmentError, few
from ..peft.adapter import Adapter


@dataclass(frozen=True)
class Update:
    """One module's factors, ready for the hook: ``A`` (r, in), ``B`` (out, r) in the compute dtype, on the device."""

    kind: str
    A: torch.Tensor
    B: torch.Tensor
    scale: float


def _weight(module):
    weight = getattr(module, "weight", None)
    return weight if isinstance(weight, torch.Tensor) else None


def module_updates(adapter: Adapter, model, *, device, dtype=torch.float32) -> dict[str, Update]:
    """``{module name: Update}`` of every module of ``adapter``, checked against ``model``.

    Each module must exist in the model with the weight shape the adapter's layout implies (``ModuleSpec.
    weight_shape``), an embedding where the adapter stores ``lora_embedding_A/B``; every problem is named at once.

    Args:
        adapter (Adapter): opened. model (torch.nn.Module): the loaded base (``AutoModelForCausalLM``).
        device (torch.device): where the factors go. dtype (torch.dtype): the model's compute dtype (PEFT casts
            the stored factors to it too).
    """
    problems, out = [], {}
    for name, spec in adapter.specs.items():
        if spec.param is not None:
            problems.append(f"{name}: adapted through target_parameters ({spec.kind}), which probe does not apply")
            continue
        try:
            module = model.get_submodule(name)
        except AttributeError:
            problems.append(f"{name}: no such module in the base model")
            continue
        weight = _weight(module)
        is_embedding = isinstance(module, torch.nn.Embedding)
        if weight is None or tuple(weight.shape) != tuple(spec.weight_shape):
            got = "no weight" if weight is None else f"weight {tuple(weight.shape)}"
            problems.append(f"{name}: the adapter's update needs a weight {tuple(spec.weight_shape)}, the base has "
                            f"{got}")
            continue
        if is_embedding != (spec.kind == "embedding"):
            problems.append(f"{name}: the adapter stores {spec.kind} factors, the base module is a "
                            f"{type(module).__name__}")
            continue
        f = adapter.factors(name)
        out[name] = Update(spec.kind, f.A.to(device=device, dtype=dtype), f.B.to(device=device, dtype=dtype),
                           float(f.scale))
    if problems:
        raise AlignmentError(f"{adapter.path}: {len(problems)} module(s) do not fit the base model "
                             f"({few(problems, 3, '; ')}); probe it on the base model it was trained on")
    return out


class LoraHooks:
    """Forward hooks on ``modules`` of ``model`` that add the active adapter's update (none until ``use``).

    Use as a context manager: the hooks are removed on the way out, whatever happens.

    Args:
        model (torch.nn.Module): the loaded base. modules (Iterable[str]): every module any adapter targets.
    """

    def __init__(self, model, modules):
        self.active: dict[str, Update] = {}
        self._handles = [model.get_submodule(m).register_forward_hook(self._hook(m)) for m in sorted(set(modules))]

    def _hook(self, name: str):
        def add_update(module, args, output):
            u = self.active.get(name)
            if u is None:
                return None
            x = args[0]
            if u.kind == "embedding":
                after_a = F.embedding(x, u.A.T, padding_idx=module.padding_idx, max_norm=module.max_norm,
                                      norm_type=module.norm_type, scale_grad_by_freq=module.scale_grad_by_freq,
                                      sparse=module.sparse)
                return output + (after_a @ u.B.T) * u.scale
            return output + F.linear(F.linear(x.to(u.A.dtype), u.A), u.B) * u.scale

        return add_update

    def use(self, updates: dict[str, Update] | None) -> None:
        """Make ``updates`` the active adapter (None: the bare base)."""
        self.active = dict(updates or {})

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
        self.active = {}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.remove()
        return False
