"""What ``vecmerge inspect`` reports about one adapter: config, scale rule, ranks, dtype, norms, hashes.

Norms are of the effective update ``scale * B @ A`` (factored, float64):
``||x||^2 = sum_m ||x_m||^2`` globally and per module type (q_proj, ..., down_proj; an expert's type is
its parameter, gate_up_proj). A MoE adapter (``target_parameters``) also gets ``experts``: per 3-D
parameter its layer, expert count, rank per expert, (out, in) per expert and norm over its experts. A DoRA
adapter's norms are of its effective update against a base model (``updates``, from ``workspace/dora.py``), a
``lora_bias`` adapter also gets the norm of its bias updates ``scale * lora_B.bias``.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Any

from ..linalg.lowrank import check_magnitude
from ..peft.adapter import Adapter
from ..peft.format import module_layer, module_types
from ..results import Result, json_field


@dataclass(frozen=True, eq=False)
class AdapterSummary(Result):
    """What ``vecmerge inspect`` prints about one adapter (``--json``: ``to_dict()``, keys in this order).

    Args:
        path (str): the folder. peft_type, base_model, task_type: as its config declares them.
        target_modules (list[str] | str | None). modules (int): LoRA modules (experts counted one by one).
        layers (int): distinct layer indices. module_types (list[str]). embedding_modules (list[str]).
        r (int), lora_alpha (float): the config's defaults. ranks ({rank: modules}), scale_rule (str),
        scales ({repr(scale): modules}), rank_pattern, alpha_pattern (dict), fan_in_fan_out (bool).
        dtype (str): stored dtypes, "/"-joined. weights (str): the weights file's name.
        norm (float): ``||scale*B@A||_F`` over all modules. norm_by_type ({type: norm}). module_norms ({module: norm}).
        base_layer_copies (list), modules_to_save (list[str]), saved_modules (list): full modules the adapter saves.
        sha256, config_sha256 (str): of the weights and of adapter_config.json.
        experts (dict | None): MoE only, per 3-D parameter ``{layer, parameter, experts, rank, shape, scale, norm}``.
        target_parameters (list | None): MoE only, as the config declares them.
        dora_base (str | None): DoRA only, the base model its effective update was formed against.
        bias_norm (float | None): lora_bias only, ``sqrt(sum_m ||scale_m * lora_B_m.bias||^2)``.
    """

    path: str
    peft_type: str
    base_model: str | None
    task_type: str | None
    target_modules: object
    modules: int
    layers: int
    module_types: list
    embedding_modules: list
    r: int
    lora_alpha: float
    ranks: dict
    scale_rule: str
    scales: dict
    rank_pattern: dict
    alpha_pattern: dict
    fan_in_fan_out: bool
    dtype: str
    weights: str
    norm: float
    norm_by_type: dict
    module_norms: dict
    base_layer_copies: list
    modules_to_save: list
    saved_modules: list
    sha256: str
    config_sha256: str
    experts: dict | None = json_field(optional=True, default=None)
    target_parameters: list | None = json_field(optional=True, default=None)
    dora_base: str | None = json_field(optional=True, default=None)
    bias_norm: float | None = json_field(optional=True, default=None)


def describe(adapter: Adapter, progress=None, updates: dict | None = None, dora_base: str | None = None
             ) -> AdapterSummary:
    """The summary ``vecmerge inspect`` prints of ``adapter`` (a typed result that reads as its JSON).

    Args:
        adapter (Adapter): an opened PEFT LoRA folder (``modules_to_save: drop`` to describe one that
            also saves full modules: they are listed, and left out of the norms).
        progress: optional callable wrapping the module iterable.
        updates (dict[str, LowRank] | None): each module's effective update when it is not ``scale * B @ A``
            (a DoRA adapter's, against ``dora_base``). dora_base (str | None): that base model's folder.
    """
    cfg = adapter.config
    specs = adapter.specs
    names = list(specs)
    it = progress(names) if progress else names
    norms = {}
    for m in it:
        x = updates[m] if updates is not None else adapter.factors(m)
        check_magnitude(m, f"the update of {adapter.path}", x, "its lora_alpha (or alpha_pattern) or weights are "
                        "extreme: check the adapter's config and use another checkpoint")
        norms[m] = x.norm()
    by_type: dict[str, float] = defaultdict(float)
    types = module_types(names, specs)
    experts: dict[str, dict] = {}
    for m, n in norms.items():
        s = specs[m]
        by_type[types[m]] += n * n
        if s.kind == "expert":
            e = experts.setdefault(s.target, {"layer": module_layer(s.holder or s.name), "parameter": s.param,
                                              "experts": s.experts, "rank": s.rank, "shape": list(s.shape),
                                              "scale": s.scale, "norm": 0.0})
            e["norm"] += n * n
    layers = sorted({i for i in map(module_layer, names) if i is not None})
    ranks = Counter(s.rank for s in specs.values())
    scales = Counter(s.scale for s in specs.values())
    for e in experts.values():
        e["norm"] = math.sqrt(e["norm"])
    info: dict[str, Any] = dict(
        path=str(adapter.path),
        peft_type=str(cfg.raw.get("peft_type", "LORA")),
        base_model=cfg.base_model,
        task_type=cfg.raw.get("task_type"),
        target_modules=cfg.target_modules,
        modules=len(specs),
        layers=len(layers),
        module_types=sorted(by_type),
        embedding_modules=[m for m, s in specs.items() if s.kind == "embedding"],
        r=cfg.r,
        lora_alpha=cfg.lora_alpha,
        ranks={str(k): v for k, v in sorted(ranks.items())},
        scale_rule=cfg.scale_rule,
        scales={repr(k): v for k, v in sorted(scales.items())},
        rank_pattern=cfg.rank_pattern,
        alpha_pattern=cfg.alpha_pattern,
        fan_in_fan_out=cfg.fan_in_fan_out,
        dtype="/".join(sorted({s.dtype for s in specs.values()})),
        weights=adapter.weights_path.name,
        norm=math.sqrt(sum(n * n for n in norms.values())),
        norm_by_type={t: math.sqrt(v) for t, v in sorted(by_type.items())},
        module_norms=norms,
        base_layer_copies=adapter.base_layer_copies,
        modules_to_save=list(cfg.modules_to_save),
        saved_modules=adapter.saved_modules,
        sha256=adapter.sha256,
        config_sha256=adapter.config_sha256,
    )
    if updates is not None:
        info["dora_base"] = dora_base
    if adapter.bias_keys:
        biases = [adapter.bias(m) for m in adapter.bias_keys]
        info["bias_norm"] = math.sqrt(sum(float(b.square().sum()) for b in biases if b is not None))
    if experts:  # MoE adapters only: {parameter: {layer, parameter, experts, rank, shape, scale, norm}}
        info.update(experts=experts, target_parameters=cfg.raw.get("target_parameters"))
    return AdapterSummary(**info)
