"""modelparts: the name rules for module kinds and targets, checked against the classes transformers builds.

The reference is the model itself: built on the meta device from a config, its ``nn.Linear``,
``Conv1D`` and ``nn.Embedding`` modules must be exactly the ones the name rules call linear, conv1d and
embedding; ``all-linear`` must equal PEFT's own ``all-linear`` expansion for a causal LM.
"""

from __future__ import annotations

import pytest
import torch

from vecmerge.errors import UsageError
from vecmerge.io.safetensors_read import TensorInfo
from vecmerge.models.parts import ALL_LINEAR, kind_of, parts, select


def infos(shapes: dict) -> dict:
    return {n: TensorInfo(n, "BF16", s, 0, 0, 0) for n, s in shapes.items()}


def test_kinds_and_layouts():
    p = parts(infos({"model.embed_tokens.weight": (100, 8), "model.layers.0.q_proj.weight": (16, 8),
                     "model.norm.weight": (8,), "lm_head.weight": (100, 8)}), "llama")
    assert set(p) == {"model.embed_tokens", "model.layers.0.q_proj", "lm_head"}
    assert p["model.embed_tokens"].kind == "embedding" and p["model.embed_tokens"].shape == (8, 100)
    assert p["model.layers.0.q_proj"].shape == (16, 8) and not p["model.layers.0.q_proj"].transposed
    assert kind_of("transformer.h.0.attn.c_attn", "gpt2") == "conv1d"
    assert kind_of("transformer.h.0.attn.c_attn", "llama") == "linear"


def test_select_rules():
    p = parts(infos({"model.embed_tokens.weight": (100, 8), "model.layers.0.self_attn.q_proj.weight": (16, 8),
                     "model.layers.0.mlp.down_proj.weight": (8, 16), "lm_head.weight": (100, 8)}), "llama")
    assert select(p, [ALL_LINEAR]) == ["model.layers.0.mlp.down_proj", "model.layers.0.self_attn.q_proj"]
    assert select(p, ["q_proj", "embed_tokens", "lm_head"]) == ["lm_head", "model.embed_tokens",
                                                                "model.layers.0.self_attn.q_proj"]
    assert select(p, ["self_attn.q_proj"]) == ["model.layers.0.self_attn.q_proj"]
    with pytest.raises(UsageError, match="q_pro.*match no 2-D weight.*down_proj"):
        select(p, ["q_pro"])
    with pytest.raises(UsageError, match="no module names given"):
        select(p, [])


def _meta_model(arch):
    import transformers
    from finetune import ARCHS

    cfg_name, model_name, kwargs = ARCHS[arch]
    with torch.device("meta"):
        return getattr(transformers, model_name)(getattr(transformers, cfg_name)(**kwargs))


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["qwen3", "llama", "gpt2"])
def test_name_rules_agree_with_the_module_classes(arch):
    from peft.tuners.tuners_utils import _maybe_include_all_linear_layers
    from transformers.pytorch_utils import Conv1D

    model = _meta_model(arch)
    want = {}
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.Embedding):
            want[name] = "embedding"
        elif isinstance(mod, Conv1D):
            want[name] = "conv1d"
        elif isinstance(mod, torch.nn.Linear):
            want[name] = "linear"
    shapes = {n: tuple(t.shape) for n, t in model.state_dict().items()}
    got = parts(infos(shapes), model.config.model_type)
    tied = {n for n in want if f"{n}.weight" not in shapes}  # tied heads are not stored
    assert {m: p.kind for m, p in got.items()} == {m: k for m, k in want.items() if m not in tied}

    from peft import LoraConfig

    cfg = _maybe_include_all_linear_layers(LoraConfig(target_modules="all-linear"), model)
    peft_all = {m for m in want if any(m == t or m.endswith("." + t) for t in cfg.target_modules)
                and want[m] != "embedding"}
    assert set(select(got, [ALL_LINEAR])) == peft_all - tied
