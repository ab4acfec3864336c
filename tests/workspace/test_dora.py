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
import warnings

import pytest
import torch

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


def test_refactor_exact_equals_peft_merge_and_unload(ws, tmp_path, tiny_base, dora, run_cli):
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
    assert man["recipe"]["base_model"] == str(tiny_base) and man["kind"] == "refactor"
    cfg = json.loads((tmp_path / "exact" / "adapter_config.json").read_text())
    assert cfg["use_dora"] is False  # written as a plain LoRA
    res = verify_output(tmp_path / "exact", base_model=tiny_base)
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
