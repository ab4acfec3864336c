"""``lora_bias`` adapters (PEFT's ``LoraConfig(lora_bias=True)``: ``lora_B`` has a bias, the layer's output gains
``scale * lora_B.bias``) read, merged and written by linear recipes, checked against PEFT itself.

References are independent of vecmerge: each input's ``scale * B @ A`` and ``scale * lora_B.bias`` from its
safetensors and config (float64), combined by the recipe's coefficients by hand, against the weights and biases
PEFT's ``merge_and_unload`` leaves (rel 1e-5: fp32 factors and a float32 merge); ``vecmerge verify`` passes with
the base model; a non-linear merge of biased adapters is refused with one line.
"""

from __future__ import annotations

import json
import re
import warnings

import pytest
import torch
from safetensors.torch import load_file

TARGETS = ["q_proj", "v_proj", "o_proj", "down_proj"]
PREFIX = "base_model.model."


@pytest.fixture(scope="module")
def biased(hf_base, peft_on, tmp_path_factory):
    """(base, {name: adapter folder}): a, b with lora_bias (random non-zero biases), c without."""
    base = hf_base("llama_bias")
    root = tmp_path_factory.mktemp("lora_bias")
    made = {}
    for name, seed, bias in (("a", 1, True), ("b", 2, True), ("c", 3, False)):
        made[name] = peft_on(base, root / name, seed, target_modules=TARGETS, lora_bias=bias)
        cfg = json.loads((made[name] / "adapter_config.json").read_text())
        cfg["base_model_name_or_path"] = str(base)
        (made[name] / "adapter_config.json").write_text(json.dumps(cfg))
    sd = load_file(made["a"] / "adapter_model.safetensors")
    biases = [k for k in sd if k.endswith("lora_B.bias")]
    assert len(biases) == 8 and all(float(sd[k].abs().min()) > 0 for k in biases)  # PEFT's random init (False)
    return base, made


def _updates(folder) -> dict:
    """``{module: (scale * B @ A, scale * lora_B.bias or zeros)}`` in float64, read by hand."""
    cfg = json.loads((folder / "adapter_config.json").read_text())
    sd = {k: v.double() for k, v in load_file(folder / "adapter_model.safetensors").items()}
    out = {}
    for k in sd:
        if k.endswith(".lora_A.weight"):
            m = k[len(PREFIX):-len(".lora_A.weight")]
            B = sd[f"{PREFIX}{m}.lora_B.weight"]
            r = int(cfg.get("rank_pattern", {}).get(m, cfg["r"]))
            s = float(cfg.get("alpha_pattern", {}).get(m, cfg["lora_alpha"])) / r
            bias = sd.get(f"{PREFIX}{m}.lora_B.bias", torch.zeros(B.shape[0], dtype=torch.float64))
            out[m] = (s * B @ sd[k], s * bias)
    return out


def _merged(base, folder) -> dict:
    """``{module: (weight, bias)}`` after PEFT's ``merge_and_unload`` of the output on ``base``."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32), folder)
        merged = model.merge_and_unload()
    return {n: (mod.weight.detach().double(), mod.bias.detach().double()) for n, mod in merged.named_modules()
            if n.rsplit(".", 1)[-1] in TARGETS}


def _plain(base) -> dict:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    return {n: (mod.weight.detach().double(), mod.bias.detach().double()) for n, mod in model.named_modules()
            if n.rsplit(".", 1)[-1] in TARGETS}


def _workspace(tmp_path, monkeypatch, made) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "vecmerge.yaml").write_text(json.dumps({"adapters": {n: str(p) for n, p in made.items()}}))


def _rel(a, b) -> float:
    return float(torch.linalg.norm(a - b) / torch.linalg.norm(b))


@pytest.mark.parametrize("args, coeffs", [
    (["refactor", "0.3*a + 0.7*b", "--rank", "exact"], {"a": 0.3, "b": 0.7}),
    (["project", "--base", "a", "--dir", "b - c", "--alpha", "0.5"], {"a": 1.0, "b": 0.5, "c": -0.5}),
    (["merge", "--method", "linear", "a", "b", "--weights", "0.6,0.4"], {"a": 0.6, "b": 0.4}),
    (["merge", "--method", "svd", "a", "c", "--weights", "1,2", "--rank", "4"], None),  # bias exact, weights cut
])
def test_linear_recipes_merge_the_biases_exactly(biased, run_cli, tmp_path, monkeypatch, args, coeffs):
    base, made = biased
    _workspace(tmp_path, monkeypatch, made)
    out = tmp_path / "out"
    res = run_cli(*args, "--out", out)
    assert res.exit_code == 0, res.output
    cfg = json.loads((out / "adapter_config.json").read_text())
    assert cfg["lora_bias"] is True
    ups = {n: _updates(p) for n, p in made.items()}
    plain, merged = _plain(base), _merged(base, out)
    weights = coeffs if coeffs is not None else {"a": 1.0, "c": 2.0}
    for m, (W0, b0) in plain.items():
        want_b = b0 + sum(c * ups[n][m][1] for n, c in weights.items())
        assert _rel(merged[m][1], want_b) < 1e-5, m  # the bias update, exact in every recipe (a vector: no cut)
        if coeffs is not None:  # exact recipes: the weights too
            want_w = W0 + sum(c * ups[n][m][0] for n, c in weights.items())
            assert _rel(merged[m][0], want_w) < 1e-5, m
    assert all(float(merged[m][1].sub(plain[m][1]).abs().max()) > 0 for m in plain)
    res = run_cli("verify", out, "--base-model", base)
    assert res.exit_code == 0, res.output


def test_a_missing_bias_is_zero(biased, run_cli, tmp_path, monkeypatch):
    base, made = biased
    _workspace(tmp_path, monkeypatch, made)
    out = tmp_path / "out"
    res = run_cli("merge", "--method", "linear", "c", "a", "--weights", "1,0.5", "--out", out)
    assert res.exit_code == 0, res.output
    ups, plain, merged = _updates(made["a"]), _plain(base), _merged(base, out)
    for m, (_, b0) in plain.items():
        assert _rel(merged[m][1], b0 + 0.5 * ups[m][1]) < 1e-5, m


@pytest.mark.parametrize("args", [
    ["merge", "--method", "ties", "--density", "0.5", "--space", "core"],
    ["merge", "--method", "dare_linear", "--density", "0.5", "--space", "core"],
])
def test_non_linear_merges_of_biases_are_refused(biased, run_cli, tmp_path, monkeypatch, args):
    _, made = biased
    _workspace(tmp_path, monkeypatch, made)
    res = run_cli(*args, "a", "b", "--out", tmp_path / "out")
    assert res.exit_code == 2, res.output
    assert len(res.output.strip().splitlines()) == 1 and "bias of a non-linear merge is undefined" in res.output
    assert not (tmp_path / "out").exists()


def test_commands_that_would_drop_the_bias_refuse_it(biased, run_cli, tmp_path):
    base, made = biased
    res = run_cli("fuse", made["a"], "--base-model", base, "--out", tmp_path / "fused")
    assert res.exit_code == 2 and "lora_bias is set" in res.output, res.output


@pytest.mark.parametrize("args", [["merge", "--method", "linear", "a", "b"], ["refactor", "0.5*a + 0.5*b"]])
def test_lora_bias_onto_a_base_without_biases_is_refused_up_front(hf_base, peft_on, run_cli, tmp_path, monkeypatch,
                                                                  args):
    """Issue 36 item 5: PEFT cannot merge a lora_B.bias into a layer without a bias, so such an output could only
    fail its own verify: refused before anything is written (one line, exit 2, naming the base and a layer)."""
    base = hf_base("llama")  # the same shapes as llama_bias, no bias in any linear layer
    made = {n: peft_on(base, tmp_path / "in" / n, seed, target_modules=TARGETS, lora_bias=True)
            for n, seed in (("a", 1), ("b", 2))}
    monkeypatch.chdir(tmp_path)
    (tmp_path / "vecmerge.yaml").write_text(json.dumps({"adapters": {n: str(p) for n, p in made.items()},
                                                        "base_model": str(base)}))
    res = run_cli(*args, "--out", tmp_path / "out")
    assert res.exit_code == 2, res.output
    assert len(res.output.strip().splitlines()) == 1 and "has no bias in 8 layer(s)" in res.output, res.output
    assert str(base) in res.output and "model.layers.0.self_attn.q_proj" in res.output
    assert not (tmp_path / "out").exists()


def test_verify_on_a_base_without_biases_says_merge_and_unload_was_not_run(biased, hf_base, run_cli, tmp_path,
                                                                            monkeypatch):
    """Issue 36 item 5: the one check PEFT cannot run (merging lora_B.bias into a layer without a bias) is NOT RUN,
    neither failed (the verdict passes: the logits checks cover the bias) nor passed silently (table and verdict)."""
    _, made = biased
    _workspace(tmp_path, monkeypatch, made)
    assert run_cli("merge", "--method", "linear", "a", "b", "--out", "out").exit_code == 0
    res = run_cli("verify", "out", "--base-model", hf_base("llama"), "--allow-base-mismatch")
    assert res.exit_code == 0, res.output
    assert re.search(r"^merge_and_unload\s+NOT RUN\s+not run: PEFT cannot merge lora_bias", res.stdout, re.M)
    assert "; NOT RUN: 1 (merge_and_unload: see their rows)" in res.stdout and "FAIL" not in res.stdout
    rows = {c["name"]: c for c in json.loads(run_cli("verify", "out", "--base-model", hf_base("llama"),
                                                     "--allow-base-mismatch", "--json").stdout)["checks"]}
    assert rows["merge_and_unload"]["passed"] is None and rows["logits"]["passed"] and rows["bias"]["passed"]
