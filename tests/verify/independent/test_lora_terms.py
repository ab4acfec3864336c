"""verify's own LoRA reading against PEFT's own: ``s * B @ A`` of every module, patterns and rsLoRA included."""

import warnings

import numpy as np
import pytest
import torch

from vecmerge.verify.independent.lora_terms import read_folder, uncovered


@pytest.mark.slow
@pytest.mark.parametrize("kwargs", [
    dict(r=4, lora_alpha=8),
    dict(r=4, lora_alpha=8, use_rslora=True),
    dict(r=4, lora_alpha=8, rank_pattern={"q_proj": 2, "layers.1.mlp.down_proj": 6},
         alpha_pattern={"v_proj": 3.0}),
    dict(r=4, lora_alpha=16, target_modules=["q_proj", "embed_tokens"]),
])
def test_every_module_equals_peft_get_delta_weight(peft_adapter, tiny_base, peft_deltas, kwargs):
    """rel 1e-12 against PEFT's get_delta_weight (float64 both; PEFT's layout: embeddings and fan-in-fan-out
    transposed, as vecmerge holds every module as (out, in) B @ A)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    name = "lt_" + "_".join(f"{k}{v}" for k, v in sorted(kwargs.items()) if not isinstance(v, (dict, list)))
    name += str(abs(hash(repr(sorted(kwargs.items())))))
    folder = peft_adapter(name, seed=3, **kwargs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_base, dtype=torch.float64),
                                          folder)
    want = peft_deltas(model)
    got = read_folder(folder)
    try:
        assert sorted(got.keys) == sorted(want)
        for m, d in want.items():
            B, A = got.factors(m)
            mine = B @ A
            ref = d.numpy() if mine.shape == tuple(d.shape) else d.numpy().T
            assert np.linalg.norm(mine - ref) <= 1e-12 * np.linalg.norm(ref), m
    finally:
        got.close()


def test_uncovered_folders_are_named(tmp_path):
    import json

    for key, what in (("use_dora", "DoRA"), ("target_parameters", "MoE")):
        f = tmp_path / key
        f.mkdir()
        (f / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", key: True}))
        (f / "adapter_model.safetensors").write_bytes(b"")
        assert what in uncovered(f)
    g = tmp_path / "bin"
    g.mkdir()
    assert "adapter_model.safetensors" in uncovered(g)
