"""Rendering ``vecmerge inspect``: one block per adapter, then its norms by module type."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import shown
from .format import g, table


def _module_count(d: Mapping[str, Any]) -> str:
    """``14 (2 layers x 7 types)`` when the modules fill that grid, else ``6 (2 layers, 4 types)``."""
    layers, types = d["layers"], len(d["module_types"])
    joint = " x " if layers * types == d["modules"] else ", "
    return f"{d['modules']} ({layers} layer{'s' * (layers != 1)}{joint}{types} type{'s' * (types != 1)})"


def render_inspect(infos: Sequence[Mapping[str, Any]]) -> str:
    """One block per adapter: config facts, then norms by module type."""
    blocks = []
    for d in infos:
        facts = [
            ("path", shown(d["path"])), ("peft type", d["peft_type"]),
            ("base model", shown(d["base_model"]) if d["base_model"] else "-"),
            ("modules", _module_count(d)),
            ("target modules", ", ".join(d["module_types"])),
            ("ranks", ", ".join(f"r={k}: {v}" for k, v in d["ranks"].items())),
            ("scale rule", f"{d['scale_rule']}, lora_alpha={g(d['lora_alpha'])}, scales "
                           + ", ".join(f"{float(k):.6g} x{v}" for k, v in d["scales"].items())),
            ("dtype", d["dtype"]), ("weights", d["weights"]),
            ("norm ||scale*B@A||", g(d["norm"], 6)), ("sha256", d["sha256"]),
        ]
        if d["rank_pattern"] or d["alpha_pattern"]:
            facts.append(("patterns", f"rank_pattern {len(d['rank_pattern'])} keys, "
                                      f"alpha_pattern {len(d['alpha_pattern'])} keys"))
        if d["embedding_modules"]:
            facts.append(("embedding LoRA", ", ".join(d["embedding_modules"])))
        if d.get("modules_to_save") or d.get("saved_modules"):
            facts.append(("modules_to_save", f"{', '.join(d['modules_to_save']) or '?'}: full trained weights "
                          f"({len(d['saved_modules'])} tensor(s)), not LoRA, left out of the norms; project, refactor "
                          "and audit refuse them unless --modules-to-save drop"))
        if d.get("dora_base"):
            facts.append(("DoRA", f"norms of the effective update m * (W + sBA) / ||W + sBA|| - W against "
                                  f"{shown(d['dora_base'])}"))
        if d.get("bias_norm") is not None:
            facts.append(("lora_bias", f"bias updates scale * lora_B.bias, norm {g(d['bias_norm'], 6)} (not in the "
                                       "norms above)"))
        if d["base_layer_copies"]:
            facts.append(("note", f"{len(d['base_layer_copies'])} saved base-layer copies ignored (not the update)"))
        norms = table([(t, g(n, 6)) for t, n in d["norm_by_type"].items()], ["module type", "norm"])
        if d.get("experts"):
            ex = d["experts"].values()
            facts.append(("experts", f"{sum(e['experts'] for e in ex)} expert modules in {len(d['experts'])} "
                                     f"parameters (target_parameters {d['target_parameters']})"))
            rows = [(e["layer"], e["parameter"], e["experts"], e["rank"], "x".join(map(str, e["shape"])),
                     g(e["norm"], 6)) for e in ex]
            norms += "\n\n" + table(rows, ["layer", "parameter", "experts", "rank per expert", "out x in", "norm"])
        blocks.append(table(facts, ["", ""], "plain") + "\n\n" + norms)
    return "\n\n".join(blocks)
