"""What vecmerge writes loads in PEFT unchanged, and PEFT's model equals the base plus our update.

Tolerances: PEFT computes in float32; our expected update is float64 from the written fp32 factors.
get_delta_weight agrees to rtol 1e-5; logits of a 2-layer model to atol 1e-4 (float32 forward).
"""

import json
import warnings

import pytest
import torch

from vecmerge.outputs.manifest import MANIFEST_NAME
from vecmerge.peft.format import LoraConfig
from vecmerge.peft.write import _patterns
from vecmerge.workspace.names import Workspace


def load_peft(base, path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), path).eval()


@pytest.mark.slow
def test_refactor_output_loads_in_peft_with_equal_logits(tiny_base, peft_adapter, peft_deltas, run_cli, tmp_path,
                                                         monkeypatch):
    a = peft_adapter("exp_a", seed=11, use_rslora=True, r=8, lora_alpha=16)
    b = peft_adapter("exp_b", seed=12, rank_pattern={"down_proj": 2}, alpha_pattern={"q_proj": 3.0})
    monkeypatch.chdir(tmp_path)
    (tmp_path / "vecmerge.yaml").write_text(f"adapters:\n  a: {a}\n  b: {b}\n")
    res = run_cli("refactor", "0.7*a - 0.4*b", "--out", "merged")
    assert res.exit_code == 0, res.output
    cfg = json.loads((tmp_path / "merged" / "adapter_config.json").read_text())
    assert cfg["r"] == 12 and cfg["rank_pattern"]  # 8 + 4 = 12, and 8 + 2 = 10 for down_proj
    assert set(cfg["rank_pattern"].values()) == {10}
    assert cfg["base_model_name_or_path"] == str(tiny_base)

    ws = Workspace()
    expected = ws.evaluate("0.7*a - 0.4*b")
    model = load_peft(tiny_base, tmp_path / "merged")
    deltas = peft_deltas(model)
    assert len(deltas) == 14
    for m, got in deltas.items():
        torch.testing.assert_close(got, expected[m].dense(), rtol=1e-5, atol=1e-7)

    # logits: the PEFT model against the base model with W + DeltaW patched in by hand (float64 forward)
    from transformers import AutoModelForCausalLM

    hand = AutoModelForCausalLM.from_pretrained(tiny_base).double().eval()
    ids = torch.randint(0, 96, (2, 10), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        plain = hand(input_ids=ids).logits
        for m, x in expected.modules.items():
            hand.get_submodule(m).weight += x.dense()
        got = model(input_ids=ids).logits.double()
        want = hand(input_ids=ids).logits
    torch.testing.assert_close(got, want, rtol=0, atol=1e-4)
    assert float((want - plain).abs().max()) > 100 * 1e-4  # the adapter really moves the logits


@pytest.mark.slow
def test_embedding_lora_round_trip(tiny_base, peft_adapter, run_cli, tmp_path, monkeypatch):
    a = peft_adapter("emb_a", seed=3, target_modules=["q_proj", "embed_tokens"])
    monkeypatch.chdir(a.parent)  # no vecmerge.yaml: the name is a folder in the current directory
    res = run_cli("refactor", f"2*{a.name}", "--out", tmp_path / "emb")
    assert res.exit_code == 0, res.output
    model = load_peft(tiny_base, tmp_path / "emb")
    emb = model.get_submodule("base_model.model.model.embed_tokens")
    want = 2 * Workspace().adapter(a.name).weight_delta("model.embed_tokens")
    torch.testing.assert_close(emb.get_delta_weight("default").double(), want, rtol=0,
                               atol=1e-6 * float(want.abs().max()))


def test_patterns_resolve_exactly_as_peft():
    ranks = {f"model.layers.{i}.mlp.up_proj": (8 if i != 1 else 4) for i in range(12)}
    alphas = {m: float(r) for m, r in ranks.items()}
    r0, a0, rp, ap = _patterns(ranks, alphas)
    cfg = LoraConfig(r=r0, lora_alpha=a0, rank_pattern=rp, alpha_pattern=ap)
    assert r0 == 8 and rp == {"model.layers.1.mlp.up_proj": 4}
    assert all(cfg.resolve(m) == (ranks[m], alphas[m]) for m in ranks)  # layers.11 is not caught by layers.1


def test_existing_out_is_refused(toy, run_cli):
    (toy / "o").mkdir()
    (toy / "o" / "notes.txt").write_text("mine")
    res = run_cli("refactor", "v28", "--out", "o")
    assert res.exit_code == 2 and "already exists; pass --force" in res.output
    res = run_cli("refactor", "v28", "--out", "o", "--force")
    assert res.exit_code == 2 and "holds no vecmerge.json" in res.output
    assert (toy / "o" / "notes.txt").read_text() == "mine"
    assert run_cli("refactor", "v28", "--out", "mine").exit_code == 0
    assert run_cli("refactor", "v51", "--out", "mine", "--force").exit_code == 0  # its own output: replaced
    assert json.loads((toy / "mine" / MANIFEST_NAME).read_text())["recipe"]["base"] == "v51"


def test_manifest_and_card(toy, run_cli):
    res = run_cli("refactor", "v54 - v54e2", "--rank", "2", "--out", "cut", "--dtype", "bf16")
    assert res.exit_code == 0, res.output
    man = json.loads((toy / "cut" / MANIFEST_NAME).read_text())
    assert man["recipe"]["base"] == "v54 - v54e2" and man["output"]["dtype"] == "bf16"
    assert set(man["inputs"]) == {"v54", "v54e2"} and len(man["inputs"]["v54"]["sha256"]) == 64
    assert all(e["rank"] == 2 for e in man["modules"].values())
    card = (toy / "cut" / "README.md").read_text()
    assert card.startswith("---\nlibrary_name: peft\nbase_model: toy-base\n")
    from safetensors import safe_open

    with safe_open(str(toy / "cut" / "adapter_model.safetensors"), "pt") as f:
        assert {f.get_slice(k).get_dtype() for k in f.keys()} == {"BF16"}
    assert not list(toy.glob(".cut.tmp-*"))


def test_fp16_overflow_is_refused_and_underflow_warns(toy, run_cli):
    res = run_cli("refactor", "1e12*v28", "--dtype", "fp16", "--out", "big")
    assert res.exit_code == 2 and "overflow fp16" in res.output and not (toy / "big").exists()
    assert not list(toy.glob(".big.*"))
    # bf16 factors of a 1e-75 update have subnormal entries: 2.3% off, within verify's 3e-2, written with a warning
    res = run_cli("refactor", "1e-75*v28", "--dtype", "bf16", "--out", "small", "--json")
    rep = json.loads(res.output)
    assert any("rounding to bf16 moved the update" in w for w in rep["outputs"][0]["warnings"])
    assert run_cli("verify", "small").exit_code == 0
    # an output whose own figures say verify would fail it is not written (issue 11, item 7)
    res = run_cli("refactor", "1e-14*v28", "--dtype", "fp16", "--out", "tiny")
    assert res.exit_code == 1 and "'vecmerge verify' accepts" in res.output and "smallest normal fp16" in res.output
    assert not (toy / "tiny").exists()
