"""An adapter as forward hooks: the same logits as PEFT (linear, GPT-2 Conv1D, embedding LoRA), and the base
untouched bit for bit after any number of switches, even when a forward pass fails inside the hooks."""

from __future__ import annotations

import warnings

import pytest
import torch
from conftest import save_peft

from vecmerge.errors import AlignmentError
from vecmerge.peft.adapter import Adapter
from vecmerge.probe.hooks import LoraHooks, module_updates

pytestmark = pytest.mark.slow


def load(base):
    from transformers import AutoModelForCausalLM

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return AutoModelForCausalLM.from_pretrained(base).eval()


def peft_logits(base, folder, ids):
    from peft import PeftModel

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = PeftModel.from_pretrained(load(base), str(folder)).eval()
    with torch.no_grad():
        return model(input_ids=ids).logits


def snapshot(model) -> dict:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("kind, lora", [
    ("qwen3", {"target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]}),
    ("qwen3", {"target_modules": ["embed_tokens", "q_proj"], "use_rslora": True}),
    ("gpt2", {"target_modules": ["c_attn", "c_proj", "c_fc"], "fan_in_fan_out": True}),
    ("gpt2", {"target_modules": ["wte", "c_attn"], "fan_in_fan_out": True}),
])
def test_hooked_logits_equal_peft(hf_base, tmp_path, kind, lora):
    base = hf_base(kind)
    folders = [save_peft(base, tmp_path / f"a{s}", seed=s, **lora) for s in (1, 2)]
    model = load(base)
    vocab = model.get_input_embeddings().num_embeddings
    ids = torch.randint(0, vocab, (3, 12), generator=torch.Generator().manual_seed(0))
    before = snapshot(model)
    with torch.no_grad():
        plain = model(input_ids=ids).logits
    updates = [module_updates(Adapter(f), model, device=torch.device("cpu")) for f in folders]
    with LoraHooks(model, {m for u in updates for m in u}) as hooks:
        for _ in range(2):  # switch back and forth: each switch is exact
            for u, f in zip(updates, folders):
                hooks.use(u)
                with torch.no_grad():
                    got = model(input_ids=ids).logits
                want = peft_logits(base, f, ids)
                assert float((got - want).abs().max()) <= 1e-5 * float(want.abs().max())
                assert float((got - plain).abs().max()) > 1e-3  # the adapter does move them
        hooks.use(None)
        with torch.no_grad():
            assert torch.equal(model(input_ids=ids).logits, plain)
    after = snapshot(model)
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    assert all(not m._forward_hooks for m in model.modules())


def test_hooks_leave_even_when_a_forward_fails(tiny_base, peft_adapter):
    model = load(tiny_base)
    before = snapshot(model)
    updates = module_updates(Adapter(peft_adapter("hooks_fail", seed=3)), model, device=torch.device("cpu"))
    with pytest.raises(IndexError):
        with LoraHooks(model, updates) as hooks:
            hooks.use(updates)
            model(input_ids=torch.tensor([[10_000]]))  # out of the vocabulary: fails inside the forward
    assert all(not m._forward_hooks for m in model.modules())
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_an_adapter_of_another_model_is_refused_naming_its_modules(hf_base, tmp_path):
    gpt2 = save_peft(hf_base("gpt2"), tmp_path / "g", target_modules=["c_attn"], fan_in_fan_out=True)
    with pytest.raises(AlignmentError, match=r"2 module\(s\) do not fit.*transformer\.h\.0\.attn\.c_attn: no such "
                                             r"module.*trained on"):
        module_updates(Adapter(gpt2), load(hf_base("qwen3")), device=torch.device("cpu"))
