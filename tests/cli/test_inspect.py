"""``cli/inspect``: inspect and audit's flags (issue 23: ``--json`` on every command that prints a table)."""

from __future__ import annotations

import json


def test_audit_takes_json_like_every_command_and_keeps_format_as_an_alias(toy, run_cli):
    ref = ("--ref", "v54 - v54e2", "--dir", "v51 - v28", "--samples", "0")
    res = run_cli("audit", *ref, "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout) == json.loads(run_cli("audit", *ref, "--format", "json").stdout)
    assert json.loads(run_cli("audit", *ref, "--json", "--format", "json").stdout)["kind"] == "audit"
    pair = json.loads(run_cli("audit", "v28", "v51", "v54", "--json").stdout)
    assert pair["kind"] == "pairwise" and pair["pairwise"]["labels"] == ["v28", "v51", "v54"]
    res = run_cli("audit", *ref, "--json", "--format", "csv")
    assert res.exit_code == 2 and "--json and --format csv ask for two formats" in res.stderr
    assert "--json" in run_cli("audit", "--help").output


def test_inspect_reads_dora_with_base_model_and_lora_bias_adapters(hf_base, peft_on, tmp_path, run_cli):
    """inspect refused DoRA and lora_bias adapters (issue 36): with --base-model a DoRA adapter's module norms are
    those of PEFT's own merge (merge_and_unload minus the base weight, float32 in PEFT: rtol 1e-5); a lora_bias
    adapter's bias norm is that of scale * lora_B.bias read from the file with safetensors."""
    import warnings

    import torch
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    base = hf_base("llama_bias")
    dora = peft_on(base, tmp_path / "dora", 3, target_modules=["q_proj", "v_proj"], use_dora=True)
    sd = load_file(str(dora / "adapter_model.safetensors"))  # magnitudes 10% off the norms, as trained ones are
    torch.manual_seed(1)
    from safetensors.torch import save_file
    save_file({k: v * (1 + 0.1 * torch.randn_like(v)) if "magnitude" in k else v for k, v in sd.items()},
              str(dora / "adapter_model.safetensors"))
    res = run_cli("inspect", dora, "--json")
    assert res.exit_code == 2 and "a DoRA adapter" in res.output and "--base-model" in res.output
    res = run_cli("inspect", dora, "--base-model", base, "--json")
    assert res.exit_code == 0, res.output
    got = json.loads(res.stdout)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        W0 = AutoModelForCausalLM.from_pretrained(base).state_dict()
        merged = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), str(dora)).merge_and_unload()
    want = {k[:-len(".weight")]: float((v.double() - W0[k].double()).norm()) for k, v in merged.state_dict().items()
            if k.endswith(".weight") and ("q_proj" in k or "v_proj" in k)}
    assert got["dora_base"] == str(base) and set(got["module_norms"]) == set(want)
    for m, n in got["module_norms"].items():
        assert abs(n - want[m]) <= 1e-5 * want[m], (m, n, want[m])
    biased = peft_on(base, tmp_path / "bias", 4, target_modules=["q_proj", "v_proj"], lora_bias=True)
    res = run_cli("inspect", biased)
    assert res.exit_code == 0, res.output
    assert "lora_bias" in res.output
    info = json.loads(run_cli("inspect", biased, "--json").stdout)
    sd = load_file(str(biased / "adapter_model.safetensors"))
    cfg = json.loads((biased / "adapter_config.json").read_text())
    scale = cfg["lora_alpha"] / cfg["r"]
    want = sum(float((scale * v.double()).square().sum()) for k, v in sd.items() if k.endswith("lora_B.bias")) ** 0.5
    assert want > 0 and abs(info["bias_norm"] - want) <= 1e-12 * want
