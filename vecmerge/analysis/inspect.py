"""What ``vecmerge inspect`` reports about one adapter: config, scale rule, ranks, dtype, norms, hashes.

Norms are of the effective update ``scale * B @ A`` (factored, float64):
``||x||^2 = sum_m ||x_m||^2`` globally and per module type (q_proj, ..., down_proj; an expert's type is
its parameter, gate_up_proj). A MoE adapter (``target_parameters``) also gets ``experts``: per 3-D
parameter its layer, expert count, rank per expert, (out, in) per expert and norm over its experts.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict

from ..linalg.lowrank import check_magnitude
from ..peft.adapter import Adapter
from ..peft.format import module_layer, module_types


def describe(adapter: Adapter, progress=None) -> dict:
    """A JSON-ready summary of ``adapter``.

    Args:
        adapter (Adapter): an opened PEFT LoRA folder (``modules_to_save: drop`` to describe one that
            also saves full modules: they are listed, and left out of the norms).
        progress: optional callable wrapping the module iterable.
    """
    cfg = adapter.config
    specs = adapter.specs
    names = list(specs)
    it = progress(names) if progress else names
    norms = {}
    for m in it:
        x = adapter.factors(m)
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
            e = experts.setdefault(s.target, {"layer": module_layer(s.holder), "parameter": s.param,
                                              "experts": s.experts, "rank": s.rank, "shape": list(s.shape),
                                              "scale": s.scale, "norm": 0.0})
            e["norm"] += n * n
    layers = sorted({module_layer(m) for m in names if module_layer(m) is not None})
    ranks = Counter(s.rank for s in specs.values())
    scales = Counter(s.scale for s in specs.values())
    for e in experts.values():
        e["norm"] = math.sqrt(e["norm"])
    info = {
        "path": str(adapter.path),
        "peft_type": str(cfg.raw.get("peft_type", "LORA")),
        "base_model": cfg.base_model,
        "task_type": cfg.raw.get("task_type"),
        "target_modules": cfg.target_modules,
        "modules": len(specs),
        "layers": len(layers),
        "module_types": sorted(by_type),
        "embedding_modules": [m for m, s in specs.items() if s.kind == "embedding"],
        "r": cfg.r,
        "lora_alpha": cfg.lora_alpha,
        "ranks": {str(k): v for k, v in sorted(ranks.items())},
        "scale_rule": cfg.scale_rule,
        "scales": {repr(k): v for k, v in sorted(scales.items())},
        "rank_pattern": cfg.rank_pattern,
        "alpha_pattern": cfg.alpha_pattern,
        "fan_in_fan_out": cfg.fan_in_fan_out,
        "dtype": "/".join(sorted({s.dtype for s in specs.values()})),
        "weights": adapter.weights_path.name,
        "norm": math.sqrt(sum(n * n for n in norms.values())),
        "norm_by_type": {t: math.sqrt(v) for t, v in sorted(by_type.items())},
        "module_norms": norms,
        "base_layer_copies": adapter.base_layer_copies,
        "modules_to_save": list(cfg.modules_to_save),
        "saved_modules": adapter.saved_modules,
        "sha256": adapter.sha256,
        "config_sha256": adapter.config_sha256,
    }
    if experts:  # MoE adapters only: {parameter: {layer, parameter, experts, rank, shape, scale, norm}}
        info["experts"] = experts
        info["target_parameters"] = cfg.raw.get("target_parameters")
    return info
