"""Reading adapters exactly as PEFT means them, and refusing what is not plain LoRA.

The reference is PEFT's own ``get_delta_weight`` on the loaded model (float32 for fp32 adapters,
bf16 arithmetic for bf16 ones); ours is float64 from the same stored factors, so they agree to
float32 round-off (rtol 1e-5) or bf16 round-off (rtol 2e-2 of the largest entry).
"""

import json
import warnings

import pytest
import torch
from safetensors.torch import load_file, save_file

from vecmerge.errors import AdapterError
from vecmerge.peft.adapter import Adapter
from vecmerge.testing import toy_adapter


def load_deltas(base, adapter_path, peft_deltas):
    """({module: PEFT's get_delta_weight as float64}, {module: PEFT's scaling}) of a real load."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), adapter_path)
    scaling = {n.removeprefix("base_model.model."): mod.scaling["default"] for n, mod in model.named_modules()
               if isinstance(getattr(mod, "scaling", None), dict) and "default" in mod.scaling}
    return peft_deltas(model), scaling


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["classic", "rslora", "patterns", "embedding"])
def test_update_equals_peft_get_delta_weight(tiny_base, peft_adapter, peft_deltas, variant):
    kwargs = {"classic": {}, "rslora": {"use_rslora": True, "r": 8, "lora_alpha": 16},
              "patterns": {"rank_pattern": {"model.layers.0.mlp.up_proj": 2, "down_proj": 6},
                           "alpha_pattern": {"o_proj": 3.0, r"layers\.1\.self_attn\.q_proj": 5.0}},
              "embedding": {"target_modules": ["q_proj", "v_proj", "embed_tokens"]}}[variant]
    path = peft_adapter(f"ad_{variant}", seed=1, **kwargs)
    ours = Adapter(path)
    ref, scaling = load_deltas(tiny_base, path, peft_deltas)
    assert set(ref) == set(ours.modules)
    for m, delta in ref.items():
        assert ours.specs[m].scale == pytest.approx(scaling[m], rel=1e-15)
        torch.testing.assert_close(ours.weight_delta(m), delta, rtol=1e-5, atol=1e-7)
    if variant == "patterns":
        assert ours.specs["model.layers.0.mlp.up_proj"].rank == 2
        assert ours.specs["model.layers.1.mlp.down_proj"].rank == 6
        assert ours.specs["model.layers.0.self_attn.o_proj"].scale == 3.0 / 4
        assert ours.specs["model.layers.1.self_attn.q_proj"].scale == 5.0 / 4
    if variant == "embedding":
        assert ours.specs["model.embed_tokens"].kind == "embedding"
        assert ours.specs["model.embed_tokens"].weight_shape == (96, 32)


@pytest.mark.slow
def test_bf16_storage_matches_peft(tiny_base, peft_adapter, peft_deltas):
    path = peft_adapter("ad_bf16", seed=2, dtype=torch.bfloat16)
    ours = Adapter(path)
    assert {s.dtype for s in ours.specs.values()} == {"bf16"}
    for m, delta in load_deltas(tiny_base, path, peft_deltas)[0].items():
        # PEFT multiplies in bf16; ours is exact in float64 from the same bf16 factors.
        torch.testing.assert_close(ours.weight_delta(m), delta, rtol=0, atol=2e-2 * float(delta.abs().max()))


@pytest.mark.slow
def test_fan_in_fan_out_gpt2(tmp_path, peft_deltas):
    from peft import LoraConfig, get_peft_model
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=1, n_embd=32, n_head=4, vocab_size=64, n_positions=32)
    model = GPT2LMHeadModel(cfg)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pm = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["c_attn", "c_fc"],
                                              fan_in_fan_out=True, init_lora_weights=False))
        pm.save_pretrained(tmp_path / "gpt2lora")
    ours = Adapter(tmp_path / "gpt2lora")
    deltas = peft_deltas(pm)
    assert set(deltas) == set(ours.modules) and len(deltas) == 2
    for m, ref in deltas.items():
        assert ours.specs[m].transposed
        assert tuple(ref.shape) == ours.specs[m].weight_shape
        torch.testing.assert_close(ours.weight_delta(m), ref, rtol=1e-5, atol=1e-7)


def test_keys_with_adapter_name_and_without_prefix(tmp_path):
    src = toy_adapter(tmp_path / "a", rank=3)
    sd = load_file(src / "adapter_model.safetensors")
    renamed = {}
    for i, (k, v) in enumerate(sd.items()):
        k = k.replace(".weight", ".default.weight") if i % 2 else k.removeprefix("base_model.model.")
        renamed[k] = v
    (tmp_path / "b").mkdir()
    save_file(renamed, tmp_path / "b" / "adapter_model.safetensors")
    (tmp_path / "b" / "adapter_config.json").write_text((src / "adapter_config.json").read_text())
    a, b = Adapter(src), Adapter(tmp_path / "b")
    assert a.modules == b.modules
    for m in a.modules:
        torch.testing.assert_close(a.factors(m).dense(), b.factors(m).dense(), rtol=0, atol=0)


def test_bin_weights_are_read(tmp_path):
    src = toy_adapter(tmp_path / "a", rank=3)
    (tmp_path / "b").mkdir()
    torch.save(load_file(src / "adapter_model.safetensors"), tmp_path / "b" / "adapter_model.bin")
    (tmp_path / "b" / "adapter_config.json").write_text((src / "adapter_config.json").read_text())
    a, b = Adapter(src), Adapter(tmp_path / "b")
    for m in a.modules:
        torch.testing.assert_close(a.factors(m).dense(), b.factors(m).dense(), rtol=0, atol=0)


# -- refusals: one line naming the file, the module and the fix ---------------------------------

def _edit_config(path, **changes):
    cfg = json.loads((path / "adapter_config.json").read_text())
    cfg.update(changes)
    (path / "adapter_config.json").write_text(json.dumps(cfg))


def test_modules_to_save_drop_is_allowed(tmp_path):
    p = toy_adapter(tmp_path / "a", rank=4)
    _edit_config(p, modules_to_save=["lm_head"])
    assert len(Adapter(p, modules_to_save="drop").modules) == 14


def test_missing_and_broken_files(tmp_path):
    with pytest.raises(AdapterError, match="no such adapter folder"):
        Adapter(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(AdapterError, match="no adapter_config.json"):
        Adapter(tmp_path / "empty")
    p = toy_adapter(tmp_path / "a")
    (p / "adapter_config.json").write_text("{not json")
    with pytest.raises(AdapterError, match="not valid JSON"):
        Adapter(p)
    p = toy_adapter(tmp_path / "b")
    data = (p / "adapter_model.safetensors").read_bytes()
    (p / "adapter_model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(AdapterError, match="truncated or corrupt"):
        a = Adapter(p)
        for m in a.modules:
            a.factors(m)
    p = toy_adapter(tmp_path / "c")
    (p / "adapter_model.safetensors").unlink()
    with pytest.raises(AdapterError, match="no adapter_model.safetensors or adapter_model.bin"):
        Adapter(p)


def _rewrite(p, fn):
    sd = load_file(p / "adapter_model.safetensors")
    fn(sd)
    save_file(sd, p / "adapter_model.safetensors")


def test_nan_shape_and_dtype_refusals(tmp_path):
    p = toy_adapter(tmp_path / "a")
    key = "base_model.model.model.layers.1.mlp.up_proj.lora_B.weight"
    _rewrite(p, lambda sd: sd[key].__setitem__((0, 0), float("nan")))
    with pytest.raises(AdapterError, match=r"module model.layers.1.mlp.up_proj: lora_B has 1 NaN/Inf"):
        Adapter(p).factors("model.layers.1.mlp.up_proj")

    p = toy_adapter(tmp_path / "b")
    _rewrite(p, lambda sd: sd.__setitem__(key, torch.zeros(48, 3)))
    with pytest.raises(AdapterError, match="disagree on the rank"):
        Adapter(p)

    p = toy_adapter(tmp_path / "c")
    _rewrite(p, lambda sd: sd.pop(key))
    with pytest.raises(AdapterError, match="lora_B is missing"):
        Adapter(p)

    p = toy_adapter(tmp_path / "d")
    _rewrite(p, lambda sd: sd.__setitem__(key, sd[key].to(torch.float64)))
    with pytest.raises(AdapterError, match="stored as F64"):
        Adapter(p)

    p = toy_adapter(tmp_path / "e")
    _rewrite(p, lambda sd: sd.__setitem__("base_model.model.model.layers.0.mlp.up_proj.lora_magnitude_vector",
                                          torch.ones(48)))
    with pytest.raises(AdapterError, match="DoRA magnitude"):
        Adapter(p)


@pytest.mark.parametrize("bias", ["lora_only", "all"])
def test_a_trained_bias_is_refused_naming_the_config_setting(tmp_path, bias):
    """PEFT's ``bias="lora_only"`` saves ``<module>.base_layer.bias`` (seen with GPT-2's c_attn, PEFT 0.21)."""
    p = toy_adapter(tmp_path / "a")
    cfg = json.loads((p / "adapter_config.json").read_text())
    (p / "adapter_config.json").write_text(json.dumps({**cfg, "bias": bias}))
    key = "base_model.model.model.layers.0.mlp.up_proj.base_layer.bias"
    _rewrite(p, lambda sd: sd.__setitem__(key, torch.ones(48)))
    with pytest.raises(AdapterError) as err:
        Adapter(p)
    msg = str(err.value)
    assert "\n" not in msg and str(p / "adapter_model.safetensors") in msg and key in msg, msg
    assert f"bias='{bias}' in adapter_config.json" in msg and "train with bias='none'" in msg, msg


GPT2_TARGETS = ["c_attn", "attn.c_proj", "mlp.c_proj", "c_fc"]


@pytest.mark.slow
def test_modules_to_save_as_peft_saves_them(tmp_path, monkeypatch, hf_base, peft_on, peft_deltas, dense_updates,
                                            run_cli):
    """Issue 12 item 3: a trained lm_head saved by PEFT (0.21: ``base_model.model.lm_head.weight``)."""
    gpt2 = hf_base("gpt2")
    for name, seed in (("h1", 1), ("h2", 2)):
        peft_on(gpt2, tmp_path / name, seed, target_modules=GPT2_TARGETS, fan_in_fan_out=True,
                modules_to_save=["lm_head"])
    keys = set(load_file(tmp_path / "h1" / "adapter_model.safetensors"))
    full = sorted(k for k in keys if "lora_" not in k)
    assert full and all(k.startswith("base_model.model.lm_head") for k in full)  # what PEFT really writes
    with pytest.raises(AdapterError, match=r"--modules-to-save drop \(project, refactor, audit"):
        Adapter(tmp_path / "h1")
    a = Adapter(tmp_path / "h1", modules_to_save="drop")
    assert a.saved_modules == full and len(a.modules) == 8
    for m, ref in load_deltas(gpt2, tmp_path / "h1", peft_deltas)[0].items():
        torch.testing.assert_close(a.weight_delta(m), ref, rtol=1e-5, atol=1e-7)

    monkeypatch.chdir(tmp_path)
    res = run_cli("inspect", "h1")  # inspect shows them instead of refusing, and names no flag of its own
    assert res.exit_code == 0 and "modules_to_save" in res.output and "lm_head" in res.output
    res = run_cli("refactor", "0.5*h1 + 0.5*h2", "--out", "avg")
    assert res.exit_code == 2 and "--modules-to-save drop" in res.output
    res = run_cli("refactor", "0.5*h1 + 0.5*h2", "--out", "avg", "--modules-to-save", "drop")
    assert res.exit_code == 0, res.output
    out_keys = set(load_file(tmp_path / "avg" / "adapter_model.safetensors"))
    assert not any("lm_head" in k for k in out_keys)
    assert json.loads((tmp_path / "avg" / "adapter_config.json").read_text())["modules_to_save"] is None
    d1, d2, got = dense_updates("h1"), dense_updates("h2"), dense_updates("avg")
    assert set(got) == set(d1)
    for m in got:  # relative Frobenius error of fp32 storage: ~4e-8
        want = 0.5 * d1[m] + 0.5 * d2[m]
        assert float(torch.linalg.norm(got[m] - want) / torch.linalg.norm(want)) < 1e-6
    res = run_cli("verify", "avg", "--base-model", gpt2)
    assert res.exit_code == 0, res.output
    assert run_cli("audit", "h1", "h2").exit_code == 2
    assert run_cli("audit", "h1", "h2", "--modules-to-save", "drop").exit_code == 0
    assert run_cli("verify", "--identities", "h1", "h2").exit_code == 0


def test_content_sha256_is_weights_and_config(tmp_path):
    """The ledger's key, recomputed with hashlib from the two files; a change to either changes it."""
    import hashlib

    from vecmerge.peft.content_hash import folder_content_sha256

    path = toy_adapter(tmp_path / "a")
    w = hashlib.sha256((path / "adapter_model.safetensors").read_bytes()).hexdigest()
    c = hashlib.sha256((path / "adapter_config.json").read_bytes()).hexdigest()
    want = hashlib.sha256(f"weights {w}\nconfig {c}\n".encode()).hexdigest()
    assert Adapter(path).content_sha256 == folder_content_sha256(path) == want
    cfg = json.loads((path / "adapter_config.json").read_text())
    (path / "adapter_config.json").write_text(json.dumps({**cfg, "lora_alpha": cfg["lora_alpha"] * 2}))
    assert folder_content_sha256(path) != want and Adapter(path).sha256 == w  # same weights, other scale
    (path / "adapter_model.safetensors").unlink()
    with pytest.raises(AdapterError, match="no adapter_model.safetensors or adapter_model.bin"):
        folder_content_sha256(path)
@pytest.mark.slow
def test_peft_saved_modules_are_read_under_drop(peft_adapter):
    """PEFT >= 0.15 saves modules_to_save as base_model.model.<module>.<param> (no 'modules_to_save' in the key)."""
    p = peft_adapter("mts_norm", r=2, target_modules=["q_proj"], modules_to_save=["model.norm"])
    keys = set(load_file(str(p / "adapter_model.safetensors")))
    assert "base_model.model.model.norm.weight" in keys
    with pytest.raises(AdapterError, match="modules_to_save"):
        Adapter(p)
    a = Adapter(p, modules_to_save="drop")
    assert a.saved_keys == ["base_model.model.model.norm.weight"] and len(a.modules) == 2


def test_adapters_are_read_through_the_one_checked_safetensors_reader(tmp_path):
    """The adapter's weights go through ``io.safetensors_read.TensorFile``: a header that reader refuses
    (tensors overlapping) is an AdapterError naming the file, and a file replaced after opening is refused
    on the first tensor read too, not only by ``load`` (its header is compared byte for byte with the one
    checked on opening)."""
    import struct

    folder = toy_adapter(tmp_path / "a", rank=2)
    weights = folder / "adapter_model.safetensors"
    data = weights.read_bytes()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    first, second = [k for k in header if k != "__metadata__"][:2]
    header[second]["data_offsets"] = [header[first]["data_offsets"][0], header[second]["data_offsets"][1]
                                      - header[second]["data_offsets"][0] + header[first]["data_offsets"][0]]
    raw = json.dumps(header).encode()
    weights.write_bytes(struct.pack("<Q", len(raw)) + raw + data[8 + n:])
    with pytest.raises(AdapterError, match=r"adapter_model.safetensors: tensors .* overlap"):
        Adapter(folder)
    weights.write_bytes(data)
    a = Adapter(folder)
    sd = load_file(str(weights))
    save_file({k: v * 2 for k, v in sd.items() if k != first}, str(weights))
    with pytest.raises(AdapterError, match=r"adapter_model.safetensors: changed while being read"):
        a.factors(a.modules[0])


def test_load_reads_once_and_hashes_the_bytes_it_reads(tmp_path):
    """Adapter.load: every factor equal bit for bit to safetensors' own reading, also float32 tensors at
    offsets that are not a multiple of 4 (after a bf16 tensor of odd size: the format allows it), and
    sha256 equal to hashlib's over the file; a file replaced by another layout after opening is refused
    with one line naming it."""
    import hashlib

    from vecmerge.io.safetensors_write import SafetensorsStream

    shapes = {"model.layers.0.mlp.down_proj": (5, 7), "model.layers.0.mlp.up_proj": (7, 5)}
    folder = toy_adapter(tmp_path / "a", shapes=shapes, rank=3, seed=3)
    weights = folder / "adapter_model.safetensors"
    sd = load_file(str(weights))
    keys = [k for k in sd if "down_proj.lora_A" in k] + [k for k in sd if "down_proj.lora_A" not in k]
    sd[keys[0]] = sd[keys[0]].bfloat16()  # 3 x 7: 21 bf16 entries, 42 bytes
    weights.unlink()
    st = SafetensorsStream(weights, [(k, [(k, "BF16" if i == 0 else "F32", tuple(sd[k].shape))])
                                     for i, k in enumerate(keys)])
    for k in keys:
        st.put(k, {k: sd[k]})
    st.close()
    a = Adapter(folder)
    a.load()
    assert a.sha256 == hashlib.sha256(weights.read_bytes()).hexdigest()
    want = load_file(str(weights))
    unloaded = Adapter(folder)  # read tensor by tensor from the file instead
    for m, spec in a.specs.items():
        for x in (a.factors(m), unloaded.factors(m)):
            assert torch.equal(x.A, want[spec.keys[0]]) and torch.equal(x.B, want[spec.keys[1]])
    b = Adapter(folder)
    save_file({k: v for k, v in want.items() if "up_proj" not in k}, str(weights))  # replaced after opening
    with pytest.raises(AdapterError, match=r"adapter_model.safetensors: changed while being read"):
        b.load()
