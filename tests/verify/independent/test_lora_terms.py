"""verify's own LoRA reading against PEFT's own: ``s * B @ A`` of every module, patterns and rsLoRA included."""

import json
import warnings

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from vecmerge.testing import toy_adapter
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

    for key, what in (("use_dora", None), ("target_parameters", "MoE")):  # DoRA: read with its base model
        f = tmp_path / key
        f.mkdir()
        (f / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", key: True}))
        (f / "adapter_model.safetensors").write_bytes(b"")
        assert uncovered(f) is None if what is None else what in uncovered(f)
    g = tmp_path / "bin"
    g.mkdir()
    assert "adapter_model.safetensors" in uncovered(g)


def test_dora_update_is_the_magnitude_times_the_direction_minus_the_base():
    """``diag(m / ||W + BA||_row) (W + BA) - W`` against the formula in torch (rel 1e-14), and a zero row refused."""
    from vecmerge.verify.independent.lora_terms import dora_update

    g = np.random.default_rng(0)
    W, B, A, m = g.standard_normal((6, 5)), g.standard_normal((6, 2)), g.standard_normal((2, 5)), g.random(6) + 0.5
    V = torch.from_numpy(W + B @ A)
    want = (torch.from_numpy(m) / V.norm(dim=1))[:, None] * V - torch.from_numpy(W)
    got = dora_update(W, B, A, m)
    assert np.linalg.norm(got - want.numpy()) <= 1e-14 * np.linalg.norm(want.numpy())
    with pytest.raises(ValueError, match="zero or not finite"):
        dora_update(np.zeros((2, 3)), np.zeros((2, 1)), np.zeros((1, 3)), np.ones(2))


def test_lora_bias_inputs_are_re_derived_with_their_biases(tmp_path, monkeypatch, run_cli):
    """Issue 36 (mutant): verify's own path once read ``B @ A`` only, never ``lora_B.bias``, and still claimed the
    update re-derived. Now it reads the biases (``scale * lora_B.bias``) and its row says it compared them."""
    monkeypatch.chdir(tmp_path)
    for name, seed in (("a", 1), ("b", 2)):
        folder = toy_adapter(name, seed=seed, extra_config={"lora_bias": True})
        sd = load_file(folder / "adapter_model.safetensors")
        g = torch.Generator().manual_seed(seed)
        sd |= {k.replace(".weight", ".bias"): torch.randn(v.shape[0], generator=g) * 0.01 for k, v in sd.items()
               if k.endswith("lora_B.weight")}
        save_file(sd, folder / "adapter_model.safetensors", metadata={"format": "pt"})
    res = run_cli("merge", "--method", "linear", "a", "b", "--weights", "0.6,0.4", "--out", "o")
    assert res.exit_code == 0, res.output
    ver = json.loads(run_cli("verify", "o", "--json").stdout)
    rows = {c["name"]: c for c in ver["checks"]}
    assert ver["passed"] and "bias" not in rows and "not_independent" not in ver  # the own path's row checks it
    assert rows["independent"]["passed"] and "the lora_bias bias updates of" in rows["independent"]["detail"]
    assert uncovered(tmp_path / "o") is None
    folder = read_folder(tmp_path / "o")
    try:
        m = next(iter(folder.bias_keys))
        want = load_file(tmp_path / "o" / "adapter_model.safetensors")[folder.bias_keys[m]].double().numpy()
        assert (folder.bias(m) == want * folder.scale(m)).all()  # scale * lora_B.bias, exactly
    finally:
        folder.close()
