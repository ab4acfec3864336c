"""`vecmerge project`: step size, consensus gate, modes, rank policies, survival, doses, manifests.

References are dense float64 computations from the stored factors (``LowRank.dense``); factored
quantities agree with them to rtol 1e-9. Written fp32 outputs agree with the intended update to
float32 round-off of the whole update: 1e-6 relative to ||base + step||.
"""

import json
import math

import pytest
import torch
from safetensors.torch import load_file

from vecmerge.adapter import Adapter
from vecmerge.pipeline import run as _run
from vecmerge.recipe import Recipe
from vecmerge.testing import toy_trajectory, tree_hashes
from vecmerge.workspace import Workspace

DISAGREE = "model.layers.1.mlp.up_proj"


def run(*args, **kwargs) -> dict:
    return _run(*args, **kwargs).to_dict()


def dense(ws, expr):
    tv = ws.evaluate(expr)
    return {m: tv[m].dense() for m in tv}


def fro(d):
    return math.sqrt(sum(float((x**2).sum()) for x in d.values()))


def written_dense(path):
    a = Adapter(path)
    return {m: a.factors(m).dense() for m in a.modules}


def test_global_trust_alpha_closed_form_and_written_update(toy, run_cli):
    ws = Workspace()
    base, d = dense(ws, "v54"), dense(ws, "v51 - v28")
    alpha = 0.0113 * fro(base) / fro(d)
    res = run_cli("project", "--base", "v54", "--dir", "v51-v28", "--trust", "0.0113", "--out", "out/v58", "--json")
    assert res.exit_code == 0, res.output
    rep = json.loads(res.output)
    assert rep["step"]["alpha"] == pytest.approx(alpha, rel=1e-12)
    assert rep["step"]["realized"]["global"] == pytest.approx(0.0113, rel=1e-12)
    assert repr(rep["step"]["alpha"]) in run_cli("project", "--base", "v54", "--dir", "v51-v28", "--trust",
                                                 "0.0113", "--dry-run").output  # full precision in the table
    got = written_dense(toy / "out/v58")
    for m in base:
        want = base[m] + alpha * d[m]
        torch.testing.assert_close(got[m], want, rtol=0, atol=1e-6 * float(want.abs().max()))
    out = rep["outputs"][0]["figures"]
    assert out["survival"] == pytest.approx(1.0, abs=1e-4)


def test_module_scope_moves_each_module_by_trust(toy):
    ws = Workspace()
    rep = run(Recipe.from_dict({"base": "v54", "dir": "v51-v28", "trust": 0.02, "trust_scope": "module"}), ws,
              dry_run=True)
    base = dense(ws, "v54")
    st = rep["step"]
    assert st["alpha"] is None
    for key in ("module_min", "module_median", "module_max", "global"):
        assert st["realized"][key] == pytest.approx(0.02, rel=1e-9)
    mods = rep["outputs"][0]["figures"]["modules"]
    for m in base:
        step = mods[m]["step_norm"]
        assert step / float(torch.linalg.norm(base[m])) == pytest.approx(0.02, rel=1e-9)


def test_alpha_with_trust_is_a_bound(toy):
    ws = Workspace()
    free = run(Recipe.from_dict({"base": "v54", "dir": "v51-v28", "alpha": 0.01}), ws, dry_run=True)["step"]
    assert free["alpha"] == 0.01 and not free["clipped"]
    bound = run(Recipe.from_dict({"base": "v54", "dir": "v51-v28", "alpha": 100.0, "trust": 0.01}), ws,
                dry_run=True)["step"]
    assert bound["clipped"] and bound["realized"]["global"] == pytest.approx(0.01, rel=1e-12)
    inside = run(Recipe.from_dict({"base": "v54", "dir": "v51-v28", "alpha": 1e-4, "trust": 0.01}), ws,
                 dry_run=True)["step"]
    assert not inside["clipped"] and inside["alpha"] == 1e-4


@pytest.fixture
def split(tmp_path, monkeypatch):
    root = tmp_path / "split"
    toy_trajectory(root, disagree=(DISAGREE,))
    monkeypatch.chdir(root)
    return root


def test_consensus_fail_drop_keep(split, run_cli):
    args = ["project", "--base", "v54", "--dir", "v51-v28", "--trust", "0.01", "--consensus-ref", "v54-v54e2"]
    before = tree_hashes(split)
    res = run_cli(*args, "--out", "o_fail")
    assert res.exit_code == 1 and DISAGREE in res.output and "nothing written" in res.output
    assert not (split / "o_fail").exists()
    res = run_cli(*args, "--on-disagree", "keep", "--min-agree", "0.99", "--out", "o_min")
    assert res.exit_code == 1 and "13/14 modules agree" in res.output and not (split / "o_min").exists()

    res = run_cli(*args, "--on-disagree", "drop", "--out", "o_drop", "--json")
    assert res.exit_code == 0, res.output
    rep = json.loads(res.output)
    assert rep["consensus"]["agree"] == 13 and rep["step"]["dropped"] == [DISAGREE]
    ws = Workspace()
    base, d = dense(ws, "v54"), dense(ws, "v51 - v28")
    d[DISAGREE] = torch.zeros_like(d[DISAGREE])
    alpha = 0.01 * fro(base) / fro(d)  # alpha is chosen after the mask
    assert rep["step"]["alpha"] == pytest.approx(alpha, rel=1e-12)
    got = written_dense(split / "o_drop")
    torch.testing.assert_close(got[DISAGREE], base[DISAGREE], rtol=0, atol=1e-7)

    res = run_cli(*args, "--on-disagree", "keep", "--out", "o_keep", "--json")
    assert res.exit_code == 0 and json.loads(res.output)["step"]["dropped"] == []
    after = tree_hashes(split)
    assert {k: v for k, v in after.items() if k.startswith("v")} == before  # inputs untouched


def test_onto_ref_and_orthogonal_against_dense(split):
    ws = Workspace()
    base, d, ref = dense(ws, "v54"), dense(ws, "v51 - v28"), dense(ws, "v54 - v54e2")
    for mode in ("onto-ref", "orthogonal"):
        rec = {"base": "v54", "dir": "v51-v28", "trust": 0.01, "mode": mode,
               "consensus": {"ref": "v54-v54e2", "on_disagree": "keep"}}
        rep = run(Recipe.from_dict(rec), ws, dry_run=True)
        shaped = {}
        for m in base:
            if mode == "onto-ref":
                c = float((d[m] * ref[m]).sum() / (ref[m] ** 2).sum())
                shaped[m] = max(c, 0.0) * ref[m]
            else:
                c = float((d[m] * base[m]).sum() / (base[m] ** 2).sum())
                shaped[m] = d[m] - c * base[m]
        alpha = 0.01 * fro(base) / fro(shaped)
        assert rep["step"]["alpha"] == pytest.approx(alpha, rel=1e-9)
        if mode == "onto-ref":
            assert rep["outputs"][0]["figures"]["modules"][DISAGREE]["step_norm"] == 0.0
        else:
            for m in base:  # the residual is orthogonal to the backbone module
                assert abs(float((shaped[m] * base[m]).sum())) < 1e-12 * fro(base) ** 2


def test_survival_of_a_rank_cut_against_dense(toy):
    ws = Workspace()
    rep = run(Recipe.from_dict({"base": "v54", "dir": "v51-v28", "trust": 0.0113, "rank": "4"}), ws, dry_run=True)
    alpha = rep["step"]["alpha"]
    base, d = dense(ws, "v54"), dense(ws, "v51 - v28")
    num = den = res2 = 0.0
    for m in base:
        target = base[m] + alpha * d[m]
        U, S, Vh = torch.linalg.svd(target)
        cut = (U[:, :4] * S[:4]) @ Vh[:4]
        step = alpha * d[m]
        num += float(((cut - base[m]) * step).sum())
        den += float((step**2).sum())
        res2 += float(((cut - target) ** 2).sum())
    fig = rep["outputs"][0]["figures"]
    assert fig["survival"] == pytest.approx(num / den, rel=1e-4, abs=1e-6)
    assert fig["residual"] == pytest.approx(math.sqrt(res2 / den), rel=1e-4)
    assert fig["survival"] < 0.99 and rep["outputs"][0]["warnings"]
    with pytest.raises(Exception, match="--strict"):
        run(Recipe.from_dict({"base": "v54", "dir": "v51-v28", "trust": 0.0113, "rank": "4", "strict": True}), ws,
            dry_run=True)


def test_keep_base_keeps_backbone_factors_bit_for_bit(toy, run_cli):
    res = run_cli("project", "--base", "v54", "--dir", "v51-v28", "--trust", "0.0113", "--rank", "keep-base",
                  "--out", "kb")
    assert res.exit_code == 0, res.output
    src = load_file(toy / "v54" / "adapter_model.safetensors")
    out = load_file(toy / "kb" / "adapter_model.safetensors")
    for k, v in src.items():
        r = v.shape[0] if k.endswith("lora_A.weight") else v.shape[1]
        part = out[k][:r] if k.endswith("lora_A.weight") else out[k][:, :r]
        assert torch.equal(part, v)
    man = json.loads((toy / "kb" / "vecmerge.json").read_text())
    assert man["figures"]["survival"] == pytest.approx(1.0, abs=1e-4)


def test_dose_ladder_manifest_rerun_and_refusals(toy, run_cli):
    res = run_cli("project", "--base", "v54", "--dir", "v51-v28", "--trust", "0.0113", "--dose", "0.5,1,1.456",
                  "--out", "out/v58", "--json")
    assert res.exit_code == 0, res.output
    rep = json.loads(res.output)
    alphas = [o["alpha"] for o in rep["outputs"]]
    assert alphas == [0.5 * rep["step"]["alpha"], rep["step"]["alpha"], 1.456 * rep["step"]["alpha"]]
    assert [o["realized"]["global"] for o in rep["outputs"]] == pytest.approx([0.00565, 0.0113, 0.0113 * 1.456])
    for k in ("0.5", "1", "1.456"):
        assert (toy / f"out/v58-x{k}" / "adapter_model.safetensors").is_file()
    sha = rep["outputs"][2]["sha256"]
    res = run_cli("run", "out/v58-x1.456/vecmerge.json", "--out", "again")
    assert res.exit_code == 0, res.output
    assert json.loads((toy / "again" / "vecmerge.json").read_text())["output"]["sha256"] == sha
    res = run_cli("run", "out/v58-x1.456/vecmerge.json", "--out", "again")
    assert res.exit_code == 2 and "already exists; pass --force" in res.output


def test_dry_run_writes_nothing(toy, run_cli):
    res = run_cli("project", "--base", "v54", "--dir", "v51-v28", "--trust", "0.0113", "--out", "dry", "--dry-run")
    assert res.exit_code == 0 and "dry run: nothing written" in res.output
    assert not (toy / "dry").exists()


def test_peft_loads_project_output_and_agrees(tiny_base, peft_adapter, run_cli, tmp_path, monkeypatch):
    import warnings

    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    names = {"b54": peft_adapter("p54", seed=54, dtype=torch.bfloat16),
             "b51": peft_adapter("p51", seed=51, use_rslora=True, r=8, lora_alpha=8),
             "b28": peft_adapter("p28", seed=28, use_rslora=True, r=8, lora_alpha=8)}
    monkeypatch.chdir(tmp_path)
    (tmp_path / "vecmerge.yaml").write_text("adapters:\n" + "".join(f"  {k}: {v}\n" for k, v in names.items()))
    res = run_cli("project", "--base", "b54", "--dir", "b51 - b28", "--alpha", "0.05", "--out", "pm")
    assert res.exit_code == 0, res.output
    ws = Workspace()
    want = ws.evaluate("b54 + 0.05*(b51 - b28)")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_base), tmp_path / "pm")
    n = 0
    for name, mod in model.named_modules():
        if hasattr(mod, "get_delta_weight") and "default" in getattr(mod, "scaling", {}):
            m = name.removeprefix("base_model.model.")
            ref = want[m].dense()
            torch.testing.assert_close(mod.get_delta_weight("default").double(), ref, rtol=0,
                                       atol=1e-6 * float(ref.abs().max()))
            n += 1
    assert n == 14


def test_streaming_bases_give_identical_bytes(toy, run_cli, monkeypatch):
    """Large models form each module's bases twice instead of holding them all: same bytes out."""
    import vecmerge.pipeline.evaluation as merge_mod

    args = ["project", "--base", "v54", "--dir", "v51-v28", "--trust", "0.0113", "--consensus-ref", "v54-v54e2"]
    assert run_cli(*args, "--out", "kept").exit_code == 0
    monkeypatch.setattr(merge_mod, "BASES_BUDGET", 0)
    assert run_cli(*args, "--out", "streamed").exit_code == 0
    a = json.loads((toy / "kept" / "vecmerge.json").read_text())
    b = json.loads((toy / "streamed" / "vecmerge.json").read_text())
    assert a["output"]["sha256"] == b["output"]["sha256"] and a["figures"] == b["figures"]
