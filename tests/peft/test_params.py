"""LoRA on raw parameters (target_parameters): PEFT's ParamWrapper layout of experts, key nesting and names."""

import pytest

from vecmerge.errors import AdapterError


def test_expert_layout_is_peft_einsum():
    """stack_experts + PEFT's ParamWrapper einsum give each expert's B_e @ A_e; expert_factors reads them back."""
    import torch

    from vecmerge.peft.params import expert_factors, stack_experts

    g = torch.Generator().manual_seed(0)
    fac = [(torch.randn(5, 3, generator=g, dtype=torch.float64), torch.randn(3, 7, generator=g, dtype=torch.float64))
           for _ in range(4)]
    A, B = stack_experts(fac)
    assert A.shape == (12, 7) and B.shape == (5, 12)
    d = torch.einsum("o r e, e r i -> e o i", B.reshape(5, 3, 4), A.reshape(4, 3, 7))  # ParamWrapper.get_delta_weight
    for e, (b, a) in enumerate(fac):
        torch.testing.assert_close(d[e], b @ a, rtol=1e-12, atol=0.0)
        got_b, got_a = expert_factors(A, B, 3, 4, e)
        assert torch.equal(got_b, b) and torch.equal(got_a, a)


def test_wrapped_keys_and_candidates_follow_peft():
    from vecmerge.peft.params import param_candidates, param_targeted, unwrap, wrapped_keys

    both = {"gate_up_proj", "down_proj"}
    assert wrapped_keys("model.layers.0.mlp.experts", "gate_up_proj", both) == (
        "base_model.model.model.layers.0.mlp.experts.base_layer.lora_A.weight",
        "base_model.model.model.layers.0.mlp.experts.base_layer.lora_B.weight")
    assert wrapped_keys("model.layers.0.mlp.experts", "down_proj", both)[0] == \
        "base_model.model.model.layers.0.mlp.experts.lora_A.weight"
    assert wrapped_keys("m", "down_proj", {"down_proj"})[0] == "base_model.model.m.lora_A.weight"
    with pytest.raises(AdapterError, match="cannot tell how PEFT nests"):
        wrapped_keys("m", "foo", {"foo", "bar"})
    assert unwrap("x.base_layer.base_layer") == ("x", 2) and unwrap("x") == ("x", 0)
    raw = {"target_parameters": ["gate.weight", "gate_up_proj", "mlp.experts.down_proj"]}
    assert param_candidates(raw, "model.layers.0.mlp.gate") == {"weight": 2, "gate_up_proj": 1}
    assert param_candidates(raw, "model.layers.0.mlp.experts") == {"gate_up_proj": 1, "down_proj": 3}
    assert param_targeted(raw, "model.layers.3.mlp.experts.down_proj")
    assert not param_targeted(raw, "model.layers.3.shared.down_proj")


def test_entry_names_of_wrapped_parameters():
    from vecmerge.peft.params import entry_name

    assert entry_name("model.layers.0.mlp.gate", "weight") == "model.layers.0.mlp.gate"
    assert entry_name("m.experts", "gate_up_proj") == "m.experts.gate_up_proj"
    assert entry_name("m.experts", "gate_up_proj", 3) == "m.experts.gate_up_proj.3"
