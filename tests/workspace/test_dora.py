"""DoRA adapters read as their effective update ``m * (W + sBA) / ||W + sBA||_c - W``, against PEFT itself.

Reference: PEFT 0.21's ``merge_and_unload`` of the DoRA adapter on the tiny Qwen3 (its merged weight minus the
base weight, float32 inside PEFT: about 1e-7 of the update) and PEFT's ``get_delta_weight`` of a plain LoRA.
The DoRA adapter's magnitudes are moved 10% off the weight norms (a trained adapter's are not the norms), so
``s B A`` alone is far from its update. Tolerances: 1e-6 relative Frobenius where the output is lossless (fp32
storage and PEFT's float32); a cut output's distance to PEFT's update equals the cut's recorded error (rtol
1e-4) and it is the optimal cut (numpy's SVD of PEFT's update, 1e-5).
"""

from __future__ import annotations

import json
import os
import shutil
import warnings

import pytest
import torch
from safetensors.torch import load_file, save_file

from vecmerge.peft.adapter import Adapter
from vecmerge.verify.checks.output import verify_output
from vecmerge.workspace.dora import as_factors, dora_update

pytestmark = pytest.mark.slow
TARGETS = ["q_proj", "v_proj", "up_proj", "down_proj"]


def save_dora(base, out, seed):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pm = get_peft_model(AutoModelForCausalLM.from_pretrained(base), LoraConfig(
            r=4, lora_alpha=8, target_modules=TARGETS, init_lora_weights=False, use_dora=True))
        with torch.no_grad():
            for name, p in pm.named_parameters():
                if "lora_magnitude_vector" in name:
                    p.mul_(1 + 0.1 * torch.randn_like(p))
        pm.save_pretrained(out)
    return out


def peft_updates(base, folder) -> dict:
    """``{module: merged weight - base weight}`` (float64) of PEFT's merge_and_unload of the adapter."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        W0 = AutoModelForCausalLM.from_pretrained(base).state_dict()
        merged = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), str(folder)).merge_and_unload()
    sd = merged.state_dict()
    return {k[:-len(".weight")]: sd[k].double() - W0[k].double() for k in sd
            if k.endswith(".weight") and any(f".{t}." in k + "." for t in TARGETS) and not torch.equal(sd[k], W0[k])}


@pytest.fixture(scope="module")
def dora(tiny_base, tmp_path_factory):
    root = tmp_path_factory.mktemp("dora")
    return save_dora(tiny_base, root / "dora", 7)


@pytest.fixture
def ws(tmp_path, dora, monkeypatch):
    """A workspace (cwd) naming the DoRA adapter ``d``."""
    (tmp_path / "vecmerge.yaml").write_text(f"adapters:\n  d: {dora}\n")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def rel(x, ref):
    return float(torch.linalg.norm(x - ref) / torch.linalg.norm(ref))


def written(folder) -> dict:
    a = Adapter(folder)
    return {m: a.factors(m).dense() for m in a.modules}


def test_refactor_exact_equals_peft_merge_and_unload(ws, tmp_path, tiny_base, dora, run_cli, monkeypatch):
    want = peft_updates(tiny_base, dora)
    assert len(want) == 2 * len(TARGETS)
    res = run_cli("refactor", "d", "--base-model", str(tiny_base), "--rank", "exact", "--out", "exact")
    assert res.exit_code == 0, res.output
    got = written(tmp_path / "exact")
    lora_only = Adapter(dora, dora=True)
    for m, d in want.items():
        assert rel(got[m], d) <= 1e-6, (m, rel(got[m], d))
        assert rel(lora_only.factors(m).dense(), d) > 0.05  # sBA alone is not DoRA's update
    man = json.loads((tmp_path / "exact" / "vecmerge.json").read_text())
    assert man["recipe"]["base_model"] == os.path.relpath(tiny_base, tmp_path) and man["kind"] == "refactor"
    cfg = json.loads((tmp_path / "exact" / "adapter_config.json").read_text())
    assert cfg["use_dora"] is False  # written as a plain LoRA
    res = verify_output(tmp_path / "exact", base_model=tiny_base)
    assert res["passed"], [c for c in res["checks"] if not c["passed"]]
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")  # the relative DoRA base starts at the workspace, not here
    res = verify_output(tmp_path / "exact")
    assert res["passed"], [c for c in res["checks"] if not c["passed"]]


def test_a_cut_dora_is_the_optimal_cut_with_its_exact_error(ws, tmp_path, tiny_base, dora, run_cli):
    want = peft_updates(tiny_base, dora)
    assert run_cli("refactor", "d", "--base-model", str(tiny_base), "--rank", "4", "--out", "cut").exit_code == 0
    got = written(tmp_path / "cut")
    man = json.loads((tmp_path / "cut" / "vecmerge.json").read_text())
    for m, d in want.items():
        U, S, Vh = torch.linalg.svd(d, full_matrices=False)
        best = (U[:, :4] * S[:4]) @ Vh[:4]
        assert rel(got[m], best) <= 1e-5, m
        assert rel(got[m], d) == pytest.approx(man["modules"][m]["rel_error"], rel=1e-4), m
        assert man["modules"][m]["rel_error"] > 0.001  # DoRA's update is not of rank 4: the cut loses something
    assert verify_output(tmp_path / "cut")["passed"]


def test_dora_and_lora_merged_like_any_update(ws, tmp_path, tiny_base, dora, peft_on, run_cli):
    lora = peft_on(tiny_base, tmp_path / "l", seed=3, target_modules=TARGETS)  # a folder named l: a name
    D, L = peft_updates(tiny_base, dora), peft_updates(tiny_base, lora)
    res = run_cli("merge", "--method", "linear", "d", "l", "--weights", "0.5,2", "--base-model", str(tiny_base),
                  "--out", "lin")
    assert res.exit_code == 0, res.output
    got = written(tmp_path / "lin")
    for m in D:
        assert rel(got[m], 0.5 * D[m] + 2 * L[m]) <= 1e-6, m
    res = run_cli("merge", "--method", "ties", "d", "l", "--density", "0.5", "--rank", "exact", "--base-model",
                  str(tiny_base), "--out", "ties")
    assert res.exit_code == 0, res.output
    assert verify_output(tmp_path / "ties")["passed"]
    res = run_cli("merge", "--method", "linear", "d", "l", "--out", "nobase")
    assert res.exit_code == 2 and "use_dora is set" in res.output and "--base-model" in res.output
    assert not (tmp_path / "nobase").exists()


def test_dora_update_is_the_formula_and_its_factors_are_exact():
    """``diag(m / ||V||_row) V - W`` with ``V = W + sBA`` (a hand computation on a 3 x 2 matrix), and the factors
    ``(D, I)`` / ``(I, D)`` hold D exactly."""
    from vecmerge.linalg.lowrank import LowRank

    W = torch.tensor([[3.0, 4.0], [0.0, 1.0], [1.0, 0.0]], dtype=torch.float64)
    lora = LowRank(torch.tensor([[0.0], [1.0], [0.0]], dtype=torch.float64),
                   torch.tensor([[0.0, 1.0]], dtype=torch.float64), 2.0)  # sBA adds 2 to W[1, 1]
    m = torch.tensor([10.0, 6.0, 1.0], dtype=torch.float64)
    D = dora_update(W, lora, m)  # V rows: [3, 4] (norm 5), [0, 3] (norm 3), [1, 0] (norm 1)
    want = torch.tensor([[6.0 - 3.0, 8.0 - 4.0], [0.0, 6.0 - 1.0], [0.0, 0.0]], dtype=torch.float64)
    assert torch.allclose(D, want, rtol=0, atol=1e-14)
    assert torch.equal(as_factors(D).dense(), D) and torch.equal(as_factors(D.T).dense(), D.T)


def test_nan_in_dora_base_weight_named_not_blamed_on_a_zero_row(ws, tmp_path, tiny_base, dora, run_cli):
    """A NaN in the base weight of a DoRA module is named (the tensor and NaN), exit 2, nothing written; it is not
    called a zero row of W + sBA."""
    import shutil

    from safetensors.torch import load_file, save_file

    base = tmp_path / "nanbase"
    shutil.copytree(tiny_base, base)
    sd = load_file(base / "model.safetensors")
    name = next(k for k in sd if k.endswith("q_proj.weight"))
    sd[name][0, 0] = float("nan")
    save_file(sd, base / "model.safetensors", metadata={"format": "pt"})
    res = run_cli("refactor", "d", "--base-model", str(base), "--rank", "exact", "--out", "nan")
    assert res.exit_code == 2, res.output
    line = res.output.strip().splitlines()[-1]
    assert name in line and "NaN" in line and "zero" not in line
    assert not (tmp_path / "nan").exists()


def test_dora_update_with_a_non_finite_row_is_not_called_zero():
    from vecmerge.errors import AdapterError
    from vecmerge.linalg.lowrank import LowRank

    W = torch.tensor([[float("nan"), 1.0], [0.0, 1.0]], dtype=torch.float64)
    lora = LowRank(torch.zeros(2, 1, dtype=torch.float64), torch.zeros(1, 2, dtype=torch.float64), 1.0)
    with pytest.raises(AdapterError, match="not finite"):
        dora_update(W, lora, torch.ones(2, dtype=torch.float64))


@pytest.mark.parametrize("value, refused", [(3e38, True), (2e19, True), (1e19, False)])
def test_a_dora_magnitude_beyond_float32s_square_root_is_refused_at_merge_time_naming_the_module(
        tmp_path, tiny_base, dora, run_cli, monkeypatch, value, refused):
    """Issue 36 item 5: a magnitude of 3e38 merged with exit 0 and failed its own verify on non-finite logits.
    Refused (exit 2, one line naming the module, nothing written) above sqrt(float32 max) = 1.84e19; below it
    the merge proceeds."""
    bad = tmp_path / "bad"
    shutil.copytree(dora, bad)
    sd = load_file(bad / "adapter_model.safetensors")
    key = next(k for k in sorted(sd) if "layers.1.self_attn.v_proj" in k and "lora_magnitude_vector" in k)
    sd[key][3] = value
    save_file(sd, bad / "adapter_model.safetensors", metadata={"format": "pt"})
    (tmp_path / "vecmerge.yaml").write_text(f"adapters:\n  d: {bad}\n")
    monkeypatch.chdir(tmp_path)
    res = run_cli("refactor", "d", "--base-model", str(tiny_base), "--rank", "exact", "--out", "o")
    if not refused:
        assert res.exit_code == 0, res.output
        return
    assert res.exit_code == 2, res.output
    assert len(res.output.strip().splitlines()) == 1, res.output
    assert "DoRA module model.layers.1.self_attn.v_proj: a magnitude of" in res.output and "1.84e+19" in res.output
    assert not (tmp_path / "o").exists()
