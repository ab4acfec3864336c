"""LoRA on raw parameters (``target_parameters``, PEFT's ``ParamWrapper``): key nesting, names, expert layout.

PEFT wraps each targeted parameter of a module in a ParamWrapper; several targeted parameters of one
module nest, the first registered innermost, so its keys carry one ``.base_layer`` per wrapper around it:
  model.layers.0.mlp.experts.base_layer.lora_A.weight   (gate_up_proj: registered first, inner)
  model.layers.0.mlp.experts.lora_A.weight              (down_proj: outer)
r and alpha resolve on ``<module>.<parameter>`` (``model.layers.0.mlp.experts.gate_up_proj``). A 3-D
parameter of E experts stores rank r per expert: lora_A (E*r, in) is (E, r, in) expert-major, lora_B
(out, r*E) is (out, r, E) expert-minor, and expert e's update is ``scale * B[:, :, e] @ A[e]`` (out, in);
``ParamWrapper.get_delta_weight`` returns it transposed for experts stored (E, in, out) (``is_transposed``),
which only the base model knows. vecmerge names expert e ``<module>.<parameter>.<e>``.
"""

from __future__ import annotations

import torch

from ..errors import AdapterError
from .format import factor_keys

WRAPPER = ".base_layer"
# transformers' fused-expert modules register gate_up_proj (or gate_proj, up_proj) before down_proj:
# the order PEFT nests its wrappers in.
PARAM_ORDER = ("gate_up_proj", "gate_proj", "up_proj", "down_proj")


def unwrap(mod: str) -> tuple[str, int]:
    """``(module, depth)`` of a key's module path: ``x.base_layer.base_layer`` -> ``(x, 2)``."""
    depth = 0
    while mod.endswith(WRAPPER):
        mod, depth = mod[: -len(WRAPPER)], depth + 1
    return mod, depth


def param_targeted(raw: dict, key: str) -> bool:
    """PEFT's rule for ``target_parameters``: ``key`` (``module.param``) is listed or ends in ``.`` + an entry."""
    entries = raw.get("target_parameters") or []
    return key in entries or any(key.endswith(f".{t}") for t in entries)


def param_candidates(raw: dict, module: str) -> dict[str, int]:
    """``{parameter: specificity}`` for every ``target_parameters`` entry PEFT would match under ``module``.

    The file does not say which parameter a wrapper holds; an entry ``gate.weight`` names the module
    too (specificity 2), a bare ``gate_up_proj`` matches under any module (specificity 1).
    """
    out: dict[str, int] = {}
    for t in raw.get("target_parameters") or []:
        leaf = str(t).rsplit(".", 1)[-1]
        key = f"{module}.{leaf}"
        if key == t or key.endswith(f".{t}"):
            out[leaf] = max(out.get(leaf, 0), str(t).count(".") + 1)
    return out


def nesting_order(params) -> list[str] | None:
    """``params`` in the order PEFT wraps them (``PARAM_ORDER``); None if two or more are not in it."""
    known = [p for p in PARAM_ORDER if p in params]
    if len(params) > 1 and len(known) != len(set(params)):
        return None
    return known or list(params)


def wrapped_keys(module: str, param: str, params) -> tuple[str, str]:
    """The (lora_A, lora_B) keys of ``param`` among the wrapped ``params`` of ``module`` (PEFT's nesting)."""
    order = nesting_order(sorted(set(params)))
    if order is None:
        raise AdapterError(f"module {module}: cannot tell how PEFT nests the wrappers of {sorted(set(params))}; "
                           "target one parameter per module, or gate_up_proj/down_proj")
    depth = len(order) - 1 - order.index(param)
    return factor_keys(module + WRAPPER * depth, "linear")


def entry_name(module: str, param: str, expert: int | None = None) -> str:
    """vecmerge's name of a wrapped parameter (``module`` for a 2-D ``weight``, such as a router) or expert."""
    if expert is not None:
        return f"{module}.{param}.{expert}"
    return module if param == "weight" else f"{module}.{param}"


def expert_factors(A, B, r: int, experts: int, e: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Expert ``e``'s ``(B_e (out, r), A_e (r, in))`` from a parameter's lora_A (E*r, in) and lora_B (out, r*E).

    Args:
        A, B: tensors, or safetensors slices (only the expert's rows / columns are read).
        r (int): the rank per expert. experts (int): E. e (int): the expert.
    """
    return B[:, e::experts], A[e * r:(e + 1) * r]


def stack_experts(factors: list) -> tuple[torch.Tensor, torch.Tensor]:
    """lora_A (E*r, in) and lora_B (out, r*E) of experts ``[(B_e, A_e), ...]`` in PEFT's layout."""
    A = torch.cat([a for _, a in factors], 0)
    B = torch.stack([b for b, _ in factors], 2)
    return A.contiguous(), B.reshape(B.shape[0], -1).contiguous()
