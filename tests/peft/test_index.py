"""The index of a weights file: each key sorted into a module's factors, a lora_bias, a saved module or a
base-layer copy, the specs checked against the config (shapes and scales written out by hand)."""

from pathlib import Path

import pytest

from vecmerge.errors import AdapterError
from vecmerge.peft.format import LoraConfig
from vecmerge.peft.index import ModuleIndex

P = "base_model.model."


def _index(shapes: dict, **raw) -> ModuleIndex:
    config = LoraConfig(r=2, lora_alpha=4.0, modules_to_save=list(raw.get("modules_to_save", [])),
                        raw={"r": 2, "lora_alpha": 4.0, **raw})
    return ModuleIndex(sorted(shapes), shapes.__getitem__, lambda key: "fp32", config, Path("w.safetensors"))


def test_every_key_is_sorted_into_its_place():
    shapes = {f"{P}m.q_proj.lora_A.weight": (2, 5), f"{P}m.q_proj.lora_B.weight": (3, 2),
              f"{P}embed.lora_embedding_A": (2, 7), f"{P}embed.lora_embedding_B": (4, 2),
              f"{P}embed.base_layer.weight": (7, 4), f"{P}lm_head.weight": (7, 4)}
    index = _index(shapes, modules_to_save=["lm_head"])
    q, e = index.specs["m.q_proj"], index.specs["embed"]
    assert sorted(index.specs) == ["embed", "m.q_proj"]
    assert (q.kind, q.shape, q.rank, q.scale, q.transposed) == ("linear", (3, 5), 2, 2.0, False)  # scale 4 / 2
    assert (e.kind, e.shape, e.rank, e.scale, e.transposed) == ("embedding", (4, 7), 2, 2.0, True)
    assert q.keys == (f"{P}m.q_proj.lora_A.weight", f"{P}m.q_proj.lora_B.weight")
    assert index.base_layer_copies == [f"{P}embed.base_layer.weight"]
    assert index.saved_modules == [f"{P}lm_head.weight"]
    assert index.bias_keys == {} and index.magnitude_keys == {}


def test_lora_bias_keys_and_their_absence():
    shapes = {f"{P}a.lora_A.weight": (2, 5), f"{P}a.lora_B.weight": (3, 2), f"{P}a.lora_B.bias": (3,)}
    assert _index(shapes, lora_bias=True).bias_keys == {"a": f"{P}a.lora_B.bias"}
    shapes |= {f"{P}b.lora_A.weight": (2, 5), f"{P}b.lora_B.weight": (3, 2)}
    with pytest.raises(AdapterError, match=r"w.safetensors: lora_bias is set but b store no lora_B.bias"):
        _index(shapes, lora_bias=True)


def test_a_rank_the_config_does_not_resolve_and_a_stray_key_are_refused():
    with pytest.raises(AdapterError, match="tensors have rank 3 but the config resolves r=2"):
        _index({f"{P}a.lora_A.weight": (3, 5), f"{P}a.lora_B.weight": (4, 3)})
    with pytest.raises(AdapterError, match="is a tensor that is not a LoRA factor"):
        _index({f"{P}a.lora_A.weight": (2, 5), f"{P}a.lora_B.weight": (4, 2), f"{P}a.other": (1,)})
