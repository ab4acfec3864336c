"""The bias updates of ``lora_bias`` inputs, merged exactly by the recipe's own linear coefficients.

With ``lora_bias`` a module's update has a bias part ``b_m = scale * lora_B.bias`` (``Adapter.bias``), linear in
the adapter. For a method whose update is a fixed linear map of its operands (``Method.linear_terms``) the
output's bias is the same map of the inputs' biases, exact in float64, a missing bias counting as zero::

    stepped: b_m = base_m + multiple * alpha_m * mult_m * c * dir_m
    merge:   b_m = mult_m * sum_k c_k * operand_k

The writer stores ``b_m / scale_out`` (``peft.write.bias_tensor``). Any other method's bias is undefined:
``check`` refuses it; ``check_base`` refuses a base model whose layer has no bias, before anything is written.
Why: docs/design/pipeline.md.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import torch

from ..errors import Problem, RecipeError, few
from ..workspace.base_model import layers_without_bias
from .evaluation import Evaluation, method_params, operand_forms


def has_biases(ev: Evaluation) -> bool:
    """Whether any input of the recipe is a ``lora_bias`` adapter with a bias in a module it writes."""
    names = set(ev.names)
    return any(names & set(v.biases) for v in ev.vectors.values())


def _terms(ev: Evaluation) -> dict | None:
    weights = tuple(e["weight"] for e in ev.recipe.models or [])
    return ev.method.linear_terms(weights, method_params(ev))


def check(ev: Evaluation) -> None:
    """RecipeError (one line) when inputs carry ``lora_bias`` biases that the method cannot merge exactly."""
    if has_biases(ev) and _terms(ev) is None:
        with_bias = [n for n, v in ev.vectors.items() if v.biases]
        raise RecipeError([Problem("{method=}{}: input(s) {} have lora_bias biases, and the bias of a non-linear "
                                   "merge is undefined; use linear, task_arithmetic, cat or svd (project: mode add; "
                                   "refactor), or inputs trained without lora_bias", ev.method.name,
                                   ", ".join(with_bias))])
    if has_biases(ev) and ev.recipe.per_module:
        raise RecipeError([Problem("{per_module}: lora_bias inputs take one weight per model for their biases; "
                                   "give constant weights (no gradient or filter), or inputs without lora_bias")])
    if has_biases(ev) and any(s.param for s in ev.specs.values()):
        raise RecipeError(["lora_bias inputs with target_parameters modules: PEFT stores no bias for a wrapped "
                           "parameter; merge the adapters' modules without target_parameters"])


def check_base(ev: Evaluation, folders: list, roots: Iterable[Path] = ()) -> None:
    """RecipeError (one line) when the first local model folder of ``folders`` has a ``<module>.weight`` but no
    ``<module>.bias`` for a module the output gives a bias: PEFT cannot merge it (``merge_and_unload``).

    Args:
        ev (Evaluation): the evaluated recipe. folders (list): candidate base model folders (None, paths or
            declared names); the first local model folder is read (``workspace.base_model.layers_without_bias``).
        roots (iterable[Path]): where a relative declared path starts (``workspace.base_model.canonical``).
    """
    if not has_biases(ev):
        return
    biased = [m for m in ev.names if any(m in v.biases for v in ev.vectors.values())]
    folder, lacking = layers_without_bias(folders, biased, roots)
    if lacking:
        raise RecipeError([Problem("lora_bias: the base model {} has no bias in {} layer(s) ({}), so PEFT cannot "
                                   "merge the output's lora_B.bias into it; merge adapters trained without "
                                   "lora_bias, or use a base model whose layers have biases", str(folder),
                                   len(lacking), few(lacking))])


def coefficients(ev: Evaluation, m: str, multiple: float) -> dict[str, float]:
    """``{input: c}``: module m's update as a fixed combination of the inputs (see the module docstring)."""
    forms, terms, k = operand_forms(ev.recipe, ev.method), _terms(ev), ev.multipliers.get(m, 1.0)
    if terms is None:
        raise ValueError(f"{ev.method.name}: no fixed combination of the inputs (``check`` refuses its biases)")
    out: dict[str, float] = {}

    def put(key: str, c: float) -> None:
        for n, a in forms[key].coeffs.items():
            out[n] = out.get(n, 0.0) + c * a

    step = ev.step
    if step is None:
        for key, c in terms.items():
            put(key, k * c)
        return out
    put("base", 1.0)
    if m not in set(ev.dropped) | set(ev.unselected):
        put("dir", terms["dir"] * k * step.module_alpha[m] * multiple)
    return out


def intended_bias(ev: Evaluation, m: str, multiple: float) -> torch.Tensor:
    """Module m's intended bias update (out,), float64 on the cpu: zero where no input has one."""
    b = torch.zeros(ev.specs[m].shape[0], dtype=torch.float64)
    for n, c in coefficients(ev, m, multiple).items():
        v = ev.vectors[n].biases.get(m)
        if v is not None and c != 0.0:
            b = b + c * v.to(device="cpu", dtype=torch.float64)
    return b
