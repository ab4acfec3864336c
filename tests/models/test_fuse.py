"""``vecmerge fuse`` against PEFT's ``merge_and_unload`` and an independent float64 sum, on tiny models.

References and tolerances:

- PEFT's ``merge_and_unload`` (fp32 base): every tensor of the fused model within ``max|a - b| <= 1e-6 max|b|``
  of PEFT's merged model (PEFT forms ``B @ A`` in float32 and adds in float32; we add in float64 and round
  once: they differ by float32 round-off, u = 6e-8), and the logits within 1e-5 relative;
- an independent float64 sum ``W + scale * B @ A`` (factors read with the safetensors library, PEFT's scale
  rule) rounded once to the output dtype: equal within one ulp of the output dtype (``torch.finfo.eps``);
- every tensor that is not a LoRA module: equal to the base's bit for bit (fp32 kept) or to its exact
  conversion (``--dtype bf16``);
- extracted-then-fused against the fine-tune: at full rank the logits agree within 1e-4 (two float32
  forwards); at lower ranks the agreement is reported (``test_extract_then_fuse_logits_agreement`` prints
  it) and must not be better than at full rank.
"""

from __future__ import annotations

import json
import warnings

import pytest
import torch
from finetune import build, logits, make_pair, prompt, rel_max, save
from safetensors.torch import load_file

from vecmerge.errors import VecmergeError
from vecmerge.models.extract_write import extract
from vecmerge.models.fuse import fuse
from vecmerge.verify.checks.output import verify_output

pytestmark = pytest.mark.slow
F64 = torch.float64


def random_adapter(base, out, seed=0, **kwargs):
    """A PEFT adapter of ``base`` with random non-zero factors (PEFT's own save_pretrained)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = get_peft_model(AutoModelForCausalLM.from_pretrained(base),
                               LoraConfig(init_lora_weights=False, **kwargs))
        for name, p in model.named_parameters():
            if "modules_to_save" in name:
                p.data += 0.1 * torch.randn_like(p)
        model.save_pretrained(out)
    return out


def merged(base, adapter):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), adapter).merge_and_unload()


def load(folder):
    from transformers import AutoModelForCausalLM

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return AutoModelForCausalLM.from_pretrained(folder)


def fused_tensors(out) -> dict:
    idx = out / "model.safetensors.index.json"
    if not idx.is_file():
        return load_file(str(out / "model.safetensors"))
    sd = {}
    for shard in sorted(set(json.loads(idx.read_text())["weight_map"].values())):
        sd.update(load_file(str(out / shard)))
    return sd


@pytest.fixture(scope="module")
def bases(tmp_path_factory):
    root = tmp_path_factory.mktemp("bases")
    return {"qwen3": save(build("qwen3"), root / "qwen3"), "gpt2": save(build("gpt2"), root / "gpt2"),
            "sharded": save(build("qwen3"), root / "sharded", max_shard_size="20KB")}


CASES = {
    "patterns": ("qwen3", dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"],
                               rank_pattern={"down_proj": 2}, alpha_pattern={"v_proj": 3})),
    "rslora": ("qwen3", dict(r=4, lora_alpha=8, target_modules=["q_proj", "o_proj"], use_rslora=True)),
    "modules_to_save": ("qwen3", dict(r=2, lora_alpha=4, target_modules=["k_proj"], modules_to_save=["model.norm"])),
    "embedding": ("qwen3", dict(r=3, lora_alpha=3, target_modules=["embed_tokens", "gate_proj"])),
    "conv1d": ("gpt2", dict(r=2, lora_alpha=4, target_modules=["c_attn", "c_fc"], fan_in_fan_out=True)),
    "sharded": ("sharded", dict(r=4, lora_alpha=8, target_modules=["q_proj", "up_proj"])),
}


@pytest.mark.parametrize("case", list(CASES))
def test_fused_equals_peft_merge_and_unload(bases, tmp_path, case):
    arch, kwargs = CASES[case]
    base = bases[arch]
    adapter = random_adapter(base, tmp_path / "adapter", **kwargs)
    man = fuse(adapter, base, tmp_path / "out")
    ref = {k: v.double() for k, v in merged(base, adapter).state_dict().items()}
    got = fused_tensors(tmp_path / "out")
    base_sd = fused_tensors(base)
    assert set(got) == set(base_sd)
    for k, v in got.items():
        assert float((v.double() - ref[k]).abs().max()) <= 1e-6 * float(ref[k].abs().max()), k
    touched = {r["tensor"] for r in man["modules"].values()} | set(man["saved"])
    assert all(torch.equal(got[k], base_sd[k]) for k in got if k not in touched)
    assert man["figures"]["copied"] == len(got) - len(touched)
    ids = prompt()
    assert rel_max(logits(load(tmp_path / "out"), ids), logits(merged(base, adapter), ids)) <= 1e-5
    assert verify_output(tmp_path / "out")["passed"]
    if case == "sharded":
        idx = json.loads((tmp_path / "out" / "model.safetensors.index.json").read_text())
        assert idx["weight_map"] == json.loads((base / "model.safetensors.index.json").read_text())["weight_map"]
        assert idx["metadata"]["total_size"] == sum(v.numel() * v.element_size() for v in got.values())


def test_bf16_rounds_once_and_converts_the_rest(bases, tmp_path, dense_updates):
    base = bases["qwen3"]
    adapter = random_adapter(base, tmp_path / "adapter", r=4, lora_alpha=8, target_modules=["q_proj", "up_proj"])
    man = fuse(adapter, base, tmp_path / "out", dtype="bf16")
    got, base_sd, upd = fused_tensors(tmp_path / "out"), fused_tensors(base), dense_updates(adapter)
    eps = torch.finfo(torch.bfloat16).eps
    for m, D in upd.items():
        exact = base_sd[f"{m}.weight"].double() + D
        err = (got[f"{m}.weight"].double() - exact).abs()
        assert bool((err <= eps * exact.abs() + 1e-30).all()), m
    for k, v in got.items():
        assert v.dtype == torch.bfloat16
        if k.rsplit(".", 1)[0] not in upd:
            assert torch.equal(v, base_sd[k].to(torch.bfloat16))
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    assert cfg.get("dtype", cfg.get("torch_dtype")) == "bfloat16"
    assert man["figures"]["converted"] == len(got) - len(upd)
    assert 0 < man["figures"]["rounding_rel"] < 1
    res = verify_output(tmp_path / "out")
    assert res["passed"], [c for c in res["checks"] if not c["passed"]]


def test_extract_then_fuse_logits_agreement(tmp_path, capsys):
    base, tuned = make_pair(tmp_path / "pair", "qwen3")
    ids = prompt()
    want = logits(tuned, ids)
    agree = {}
    for rank in ("2", "8", "1000"):
        extract(base, tuned, tmp_path / f"lora{rank}", rank=rank, others="save")
        fuse(tmp_path / f"lora{rank}", base, tmp_path / f"fused{rank}")
        agree[rank] = rel_max(logits(load(tmp_path / f"fused{rank}"), ids), want)
        assert verify_output(tmp_path / f"fused{rank}")["passed"]
    with capsys.disabled():
        print("\nextracted-then-fused vs the fine-tune, max|dlogits| / max|logits|: "
              + ", ".join(f"rank {k}: {v:.3e}" for k, v in agree.items()))
    assert agree["1000"] <= 1e-4
    assert agree["2"] >= agree["1000"] and agree["8"] >= agree["1000"]


def test_gpt2_extract_then_fuse_with_a_tied_head(tmp_path):
    base, tuned = make_pair(tmp_path / "pair", "gpt2", freeze=(".bias",))
    man = extract(base, tuned, tmp_path / "lora", rank="1000", others="save")
    assert man["others"]["saved_tensors"]["lm_head.weight"] == "transformer.wte.weight"
    fuse(tmp_path / "lora", base, tmp_path / "fused")
    ids = prompt()
    assert rel_max(logits(load(tmp_path / "fused"), ids), logits(tuned, ids)) <= 1e-4
    assert verify_output(tmp_path / "fused")["passed"]


def test_verify_catches_tampering(bases, tmp_path):
    base = bases["qwen3"]
    adapter = random_adapter(base, tmp_path / "adapter", r=2, lora_alpha=2, target_modules=["q_proj"])
    fuse(adapter, base, tmp_path / "out")
    f = tmp_path / "out" / "model.safetensors"
    data = bytearray(f.read_bytes())
    data[-3] ^= 0x40
    f.write_bytes(bytes(data))
    failed = {c["name"] for c in verify_output(tmp_path / "out")["checks"] if not c["passed"]}
    assert {"output files", "tensors"} <= failed


def test_refusals_and_cli(bases, tmp_path, run_cli):
    adapter = random_adapter(bases["gpt2"], tmp_path / "gpt2-lora", r=2, target_modules=["c_attn"],
                             fan_in_fan_out=True)
    with pytest.raises(VecmergeError, match="no weight .* in the base model"):
        fuse(adapter, bases["qwen3"], tmp_path / "x")
    assert not (tmp_path / "x").exists()
    q = random_adapter(bases["qwen3"], tmp_path / "q-lora", r=2, target_modules=["q_proj"])
    r = run_cli("fuse", q, "--base-model", bases["qwen3"], "--out", tmp_path / "o", "--dtype", "fp16")
    assert r.exit_code == 0, r.output
    assert "rounded once to fp16" in r.output
    r = run_cli("fuse", q, "--base-model", bases["qwen3"], "--out", tmp_path / "o")
    assert r.exit_code == 2 and "already exists" in r.output
    r = run_cli("fuse", q, "--base-model", bases["qwen3"], "--out", tmp_path / "o", "--force")
    assert r.exit_code == 0
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    r = run_cli("fuse", q, "--base-model", bases["qwen3"], "--out", tmp_path / "mine", "--force")
    assert r.exit_code == 2 and (tmp_path / "mine" / "notes.txt").read_text() == "keep"
    r = run_cli("fuse", q, "--out", tmp_path / "o3")
    assert r.exit_code == 2 and "--base-model" in r.output
    r = run_cli("fuse", q, "--base-model", bases["qwen3"], "--out", bases["qwen3"] / "sub")
    assert r.exit_code == 2 and "lies inside" in r.output
    r = run_cli("verify", tmp_path / "o")
    assert r.exit_code == 0 and "PASSED" in r.output


def test_tokenizer_and_other_files_are_copied_byte_for_byte(bases, tmp_path, run_cli):
    """Issue 16 item 2d: the base's tokenizer files (JSON, and a binary tokenizer.model) are in the fused folder as
    byte-identical copies, listed in the manifest; the base's own README.md is not copied (the fused model gets its
    own card); verify compares the copies with the base's files and names one that was changed."""
    import shutil

    from vecmerge.testing import toy_adapter

    base = tmp_path / "base"
    shutil.copytree(bases["qwen3"], base)
    files = {"tokenizer.json": json.dumps({"version": "1.0", "model": {"vocab": {"é": 0, "<s>": 1}}},
                                          ensure_ascii=False).encode(),  # no trailing newline, UTF-8
             "tokenizer_config.json": b'{"bos_token": "<s>", "model_max_length": 64}\n',
             "special_tokens_map.json": b'{"bos_token": "<s>"}',
             "tokenizer.model": bytes(range(256)) * 3}
    for name, data in files.items():
        (base / name).write_bytes(data)
    (base / "README.md").write_text("# the base's own card\n")
    adapter = toy_adapter(tmp_path / "lora", config=json.loads((base / "config.json").read_text()), rank=2)
    res = run_cli("fuse", adapter, "--base-model", base, "--out", tmp_path / "fused")
    assert res.exit_code == 0, res.output
    man = json.loads((tmp_path / "fused" / "vecmerge.json").read_text())
    for name, data in files.items():
        assert (tmp_path / "fused" / name).read_bytes() == data, name
    assert set(files) <= set(man["output"]["copied_files"]) and "README.md" not in man["output"]["copied_files"]
    assert "the base's own card" not in (tmp_path / "fused" / "README.md").read_text()
    res = run_cli("verify", tmp_path / "fused", "--json")
    assert res.exit_code == 0 and next(c for c in json.loads(res.stdout)["checks"] if c["name"] == "files")["passed"]
    (tmp_path / "fused" / "tokenizer.json").write_bytes(files["tokenizer.json"] + b" ")
    res = run_cli("verify", tmp_path / "fused")
    assert res.exit_code != 0 and "tokenizer.json: differs from the base's" in res.output


def test_a_non_finite_value_is_never_written(tmp_path, run_cli):
    """Issue 23: whatever fuse would write that is NaN or Inf (a base's own tensor copied through, or a sum
    that overflows the output dtype) is refused naming the tensor; nothing is written."""
    from safetensors.torch import save_file

    from vecmerge.testing import toy_adapter

    q = "model.layers.0.self_attn.q_proj"
    base = tmp_path / "base"
    base.mkdir()
    (base / "config.json").write_text(json.dumps({"model_type": "llama"}))
    tensors = {q + ".weight": torch.full((16, 8), 65500.0), "model.norm.weight": torch.tensor([1.0, float("inf")])}
    save_file(tensors, str(base / "model.safetensors"))
    toy_adapter(tmp_path / "a", shapes={q: (16, 8)}, std=3.0)  # sums past fp16's 65504
    r = run_cli("fuse", tmp_path / "a", "--base-model", base, "--out", tmp_path / "o")
    assert r.exit_code == 2 and r.stderr.count("\n") == 1, r.output
    assert "tensor model.norm.weight holds 1+ NaN/Inf value(s) (F32)" in r.stderr
    tensors["model.norm.weight"] = torch.ones(2)
    save_file(tensors, str(base / "model.safetensors"))
    r = run_cli("fuse", tmp_path / "a", "--base-model", base, "--out", tmp_path / "o", "--dtype", "fp16")
    assert r.exit_code == 2 and f"tensor {q}.weight holds" in r.stderr and "(F16)" in r.stderr, r.output
    assert not (tmp_path / "o").exists() and sorted(p.name for p in tmp_path.iterdir()) == ["a", "base"]
    assert run_cli("fuse", tmp_path / "a", "--base-model", base, "--out", tmp_path / "o").exit_code == 0


@pytest.mark.slow
def test_a_moe_adapter_is_refused_with_its_real_cause(tmp_path, run_cli):
    """Issue 23: a ``target_parameters`` adapter (PEFT adapts the experts' 3-D parameters in memory) into a
    transformers-saved Mixtral (stored one tensor per expert, ``block_sparse_moe.experts.<e>.w1``) was refused
    as "trained on another model". The cause is the layout: the refusal names target_parameters and the fix."""
    from peft import LoraConfig, get_peft_model
    from transformers import MixtralConfig, MixtralForCausalLM

    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        MixtralForCausalLM(MixtralConfig(vocab_size=64, hidden_size=16, intermediate_size=24, num_hidden_layers=1,
                                         num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
                                         num_experts_per_tok=2, max_position_embeddings=32,
                                         tie_word_embeddings=False)).save_pretrained(tmp_path / "base")
        for name, kw in (("experts", dict(target_modules=["q_proj"], target_parameters=["mlp.experts.down_proj"])),
                         ("all", dict(target_modules="all-linear"))):
            model = MixtralForCausalLM.from_pretrained(tmp_path / "base")
            get_peft_model(model, LoraConfig(r=2, lora_alpha=4, **kw)).save_pretrained(tmp_path / name)
    assert any(".experts.0." in k for k in load_file(str(tmp_path / "base" / "model.safetensors")))
    for name in ("experts", "all"):
        r = run_cli("fuse", tmp_path / name, "--base-model", tmp_path / "base", "--out", tmp_path / "o")
        assert r.exit_code == 2 and r.stderr.count("\n") == 1, r.output
        assert "through target_parameters" in r.stderr and "model.layers.0.mlp.experts.down_proj" in r.stderr
        assert "per-expert layout (this base stores e.g. model.layers.0.block_sparse_moe.experts." in r.stderr
        assert "merge_and_unload" in r.stderr and "another model" not in r.stderr
        assert not (tmp_path / "o").exists()
