"""Tests for vecmerge.demo.trajectories: toy LoRA trajectories really trained on a tiny Qwen3."""

import json
import math

import pytest
import torch

pytest.importorskip("peft")
pytest.importorskip("transformers")

from safetensors import safe_open  # noqa: E402

from vecmerge.demo.trajectories import LINEAGE, make_trajectories

SMALL = dict(seed=0, layers=1, steps=10)  # a few seconds on a 2-core CPU
NAMES = ("v28", "v51", "v54e2", "v54")


pytestmark = pytest.mark.slow  # every test here trains (or checks training's arguments)


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    out = tmp_path_factory.mktemp("toy")
    return out, make_trajectories(out, **SMALL)


def _tensors(folder):
    with safe_open(str(folder / "adapter_model.safetensors"), framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def _deltas(folder):
    """Dense effective updates ``scale * B @ A`` per module, in float32."""
    cfg = json.loads((folder / "adapter_config.json").read_text())
    r, alpha = cfg["r"], cfg["lora_alpha"]
    scale = alpha / math.sqrt(r) if cfg["use_rslora"] else alpha / r
    t = _tensors(folder)
    return {
        k[: -len(".lora_A.weight")]: scale * t[k.replace("lora_A", "lora_B")].float() @ t[k].float()
        for k in t
        if k.endswith("lora_A.weight")
    }


def test_layout_and_manifest(toy):
    out, paths = toy
    assert set(paths) == {"base", *NAMES}
    assert all(p.is_absolute() and p.is_dir() for p in paths.values())
    assert (paths["base"] / "config.json").is_file()
    assert (paths["base"] / "model.safetensors").is_file()
    for name in NAMES:
        assert (paths[name] / "adapter_config.json").is_file()
        assert (paths[name] / "adapter_model.safetensors").is_file()
        cfg = json.loads((paths[name] / "adapter_config.json").read_text())
        assert cfg["base_model_name_or_path"] == str(paths["base"])
        assert set(cfg["target_modules"]) == {
            "q_proj",
            "k_proj",
            "v_proj",
            "o_proj",
            "gate_proj",
            "up_proj",
            "down_proj",
        }
    yaml = pytest.importorskip("yaml")
    manifest = yaml.safe_load((out / "vecmerge.yaml").read_text())
    assert manifest == {"base_model": "base", "adapters": {n: {"path": n, "parent": LINEAGE[n]} for n in NAMES}}


def test_rslora_and_dtypes(toy):
    _, paths = toy
    for name, rslora, dtype in (
        ("v28", True, torch.float32),
        ("v51", True, torch.float32),
        ("v54e2", False, torch.bfloat16),
        ("v54", False, torch.bfloat16),
    ):
        cfg = json.loads((paths[name] / "adapter_config.json").read_text())
        assert cfg["use_rslora"] is rslora, name
        tensors = _tensors(paths[name])
        assert len(tensors) == 2 * 7 * SMALL["layers"]
        assert {t.dtype for t in tensors.values()} == {dtype}, name


def test_updates_nonzero_and_aligned(toy):
    _, paths = toy
    d = {name: _deltas(paths[name]) for name in NAMES}
    for name in NAMES:
        assert all(delta.norm() > 1e-2 for delta in d[name].values()), name
    steps = [(d["v51"][k] - d["v28"][k], d["v54"][k] - d["v54e2"][k]) for k in d["v28"]]
    assert all(a.norm() > 1e-2 and b.norm() > 1e-2 for a, b in steps)
    # Both differences are descent steps on the same task: positive inner product everywhere.
    assert all(torch.sum(a * b) > 0 for a, b in steps)


def test_peft_loads_bf16_adapter_and_its_effect_is_the_update(toy, dense_updates):
    """PEFT's logits with v54 (bf16) equal the base's with W + scale*B@A patched in by hand (float32
    forwards: atol 1e-4), and the adapter moves them far beyond that tolerance."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    _, paths = toy
    base = AutoModelForCausalLM.from_pretrained(paths["base"]).eval()
    ids = torch.arange(12).unsqueeze(0)
    with torch.no_grad():
        before = base(input_ids=ids).logits.double()
    model = PeftModel.from_pretrained(base, str(paths["v54"])).eval()
    with torch.no_grad():
        after = model(input_ids=ids).logits.double()
    hand = AutoModelForCausalLM.from_pretrained(paths["base"]).eval()
    with torch.no_grad():
        for m, d in dense_updates(paths["v54"]).items():
            w = hand.get_submodule(m).weight
            w.copy_((w.double() + d).float())
        patched = hand(input_ids=ids).logits.double()
    torch.testing.assert_close(after, patched, rtol=0, atol=1e-4)
    assert float((after - before).abs().max()) > 100 * 1e-4


def test_deterministic_and_restores_state(toy, tmp_path):
    _, first = toy
    threads = torch.get_num_threads()
    torch.manual_seed(1234)
    expected = torch.rand(3)
    torch.manual_seed(1234)
    second = make_trajectories(tmp_path / "again", **SMALL)
    assert torch.equal(torch.rand(3), expected)  # caller's RNG stream untouched
    assert torch.get_num_threads() == threads
    for name in ("base", *NAMES):
        file = "model.safetensors" if name == "base" else "adapter_model.safetensors"
        assert (first[name] / file).read_bytes() == (second[name] / file).read_bytes(), name


@pytest.mark.parametrize("kwargs", [dict(layers=0), dict(rank=0), dict(steps=0), dict(hidden=60)])
def test_bad_arguments(tmp_path, kwargs):
    with pytest.raises(ValueError):
        make_trajectories(tmp_path, **kwargs)
    assert not any(tmp_path.iterdir())


def test_history_keeps_half_epochs_and_leaves_the_four_unchanged(toy, tmp_path):
    from vecmerge.demo.trajectories import HISTORY

    out, first = toy
    more = make_trajectories(tmp_path / "history", history=True, **SMALL)
    assert set(more) == {"base", *NAMES, *HISTORY}
    for name in ("base", *NAMES):
        file = "model.safetensors" if name == "base" else "adapter_model.safetensors"
        assert (first[name] / file).read_bytes() == (more[name] / file).read_bytes(), name
    for name in HISTORY:
        assert (more[name] / "adapter_model.safetensors").is_file()
    assert (tmp_path / "history" / "vecmerge.yaml").read_text() == (out / "vecmerge.yaml").read_text()
    h1, h2 = _deltas(more["v28_h1"]), _deltas(more["v28_h2"])
    assert all(not torch.equal(h1[k], h2[k]) for k in h1)  # saved at different steps
    with pytest.raises(ValueError, match="steps must be >= 4"):
        make_trajectories(tmp_path / "short", history=True, steps=3)


def test_probe_prompts_are_held_out_sequences(tmp_path):
    from vecmerge.demo.trajectories import write_probe_prompts

    path = write_probe_prompts(tmp_path / "p.jsonl", seed=0, items=8, prompt=10)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["id"] for r in rows] == [f"h{i}" for i in range(8)]
    assert all(len(r["prompt_ids"]) == 10 and len(r["target_ids"]) == 22 for r in rows)
    assert path.read_bytes() == write_probe_prompts(tmp_path / "q.jsonl", seed=0, items=8, prompt=10).read_bytes()
    with pytest.raises(ValueError):
        write_probe_prompts(tmp_path / "r.jsonl", prompt=32)
