"""``vecmerge extract`` on tiny transformers models fully fine-tuned in the test, against independent references.

References: the difference ``D = W_tuned - W_base`` read with the safetensors library, its float64
``torch.linalg.svd`` (Eckart-Young: the optimal rank-N error is ``sqrt(sum_{i>=N} sigma_i^2)``), the
written update as PEFT itself computes it (``get_delta_weight`` of the loaded ``PeftModel``), and the
fine-tune's own logits. Tolerances:

- rank N, full-SVD path (qwen3, gpt2: every side <= 4 (N + 10)): ``||D - W_peft|| / ||D||`` equals the
  optimal relative error within 1e-6 absolute (the factors are stored in fp32, u = 6e-8);
- rank N, randomized path (llama, hidden 256, N = 8): at most 1% above the optimal error, and the
  recorded dropped energy equals ``||D - U S Vh||^2`` (checked in test_extract_rank) so the recorded
  relative error matches PEFT's within 1e-6;
- full rank with the other tensors saved: PEFT's logits equal the fine-tune's within
  ``max|dl| / max|l| <= 1e-4`` (two float32 forwards);
- energy:E: every module's rank equals the minimal rank of its float64 spectrum (or, on the randomized
  path, lies in the recorded certified bracket, which holds the minimal rank).
"""

from __future__ import annotations

import json
import math
import os
import warnings
from pathlib import Path

import pytest
import torch
from finetune import logits, make_pair, prompt, rel_max
from safetensors.torch import load_file

from vecmerge.errors import ModelError, UsageError, VecmergeError
from vecmerge.models.extract_write import extract
from vecmerge.verify.checks.output import verify_output

F64 = torch.float64


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    root = tmp_path_factory.mktemp("pairs")
    made = {}

    def get(arch, **kw):
        key = (arch, tuple(sorted(kw.items())))
        if key not in made:
            made[key] = make_pair(root / f"{arch}-{len(made)}", arch, **kw)
        return made[key]

    return get


def differences(base, tuned, modules: dict) -> dict:
    """``{module: D}`` float64 in the LoRA layout (out, in), from the safetensors files."""
    b, t = load_file(str(base / "model.safetensors")), load_file(str(tuned / "model.safetensors"))
    out = {}
    for m, rec in modules.items():
        D = t[f"{m}.weight"].to(F64) - b[f"{m}.weight"].to(F64)
        out[m] = D.T if rec["kind"] in ("conv1d", "embedding") else D
    return out


def peft_model(base, adapter):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), adapter)


def peft_updates(model, modules: dict) -> dict:
    """PEFT's ``get_delta_weight`` of each module, in the LoRA layout."""
    from peft.tuners.lora import LoraLayer

    out = {}
    for name, mod in model.named_modules():
        m = name.removeprefix("base_model.model.")
        if isinstance(mod, LoraLayer) and m in modules:
            d = mod.get_delta_weight("default").to(F64)
            out[m] = d.T if modules[m]["kind"] in ("conv1d", "embedding") else d
    return out


def optimal_rel(D, k) -> float:
    S = torch.linalg.svdvals(D)
    return math.sqrt(float((S[k:] ** 2).sum()) / float((S**2).sum()))


@pytest.mark.slow
@pytest.mark.parametrize("arch,rank,path", [("qwen3", 4, "full"), ("gpt2", 4, "full"), ("llama", 8, "randomized")])
def test_rank_n_is_the_optimal_cut_as_peft_applies_it(pairs, tmp_path, arch, rank, path):
    base, tuned = pairs(arch)
    man = extract(base, tuned, tmp_path / "out", rank=str(rank), others="drop")
    mods = man["modules"]
    assert {r["method"] for r in mods.values()} == {path}
    D = differences(base, tuned, mods)
    W = peft_updates(peft_model(base, tmp_path / "out"), mods)
    assert set(W) == set(mods)
    for m, rec in mods.items():
        got = float(torch.linalg.vector_norm(D[m] - W[m]) / torch.linalg.vector_norm(D[m]))
        opt = optimal_rel(D[m], rank)
        assert got == pytest.approx(rec["rel_error"], abs=1e-6)
        assert rec["dropped_energy"] == pytest.approx(rec["rel_error"] ** 2 * rec["total_energy"], rel=1e-9)
        if path == "full":
            assert got == pytest.approx(opt, abs=1e-6)
        else:
            assert opt - 1e-6 <= got <= 1.01 * opt
    assert verify_output(tmp_path / "out")["passed"]


@pytest.mark.slow
@pytest.mark.parametrize("arch,targets", [("qwen3", ["all-linear"]),
                                          ("qwen3", ["all-linear", "embed_tokens", "lm_head"]),
                                          ("llama", ["all-linear"])])
def test_full_rank_reproduces_the_fine_tunes_logits(pairs, tmp_path, arch, targets):
    base, tuned = pairs(arch)
    man = extract(base, tuned, tmp_path / "out", rank="100000", targets=targets, others="save")
    assert man["figures"]["rel_error"] < 1e-12
    if "embed_tokens" in targets:
        assert man["modules"]["model.embed_tokens"]["kind"] == "embedding"
        assert "model.embed_tokens" not in man["others"]["saved_modules"]
    ids = prompt()
    assert rel_max(logits(peft_model(base, tmp_path / "out"), ids), logits(tuned, ids)) <= 1e-4
    assert verify_output(tmp_path / "out")["passed"]


@pytest.mark.slow
def test_gpt2_conv1d_full_rank_reproduces_logits(pairs, tmp_path):
    base, tuned = pairs("gpt2", freeze=(".bias",))  # PEFT cannot save a LoRA module's bias: keep them fixed
    man = extract(base, tuned, tmp_path / "out", rank="1000", others="save")
    assert {r["kind"] for r in man["modules"].values()} == {"conv1d"}
    cfg = json.loads((tmp_path / "out" / "adapter_config.json").read_text())
    assert cfg["fan_in_fan_out"] is True and "transformer.ln_f" in cfg["modules_to_save"]
    ids = prompt()
    assert rel_max(logits(peft_model(base, tmp_path / "out"), ids), logits(tuned, ids)) <= 1e-4
    assert verify_output(tmp_path / "out")["passed"]


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["qwen3", "llama"])
def test_energy_ranks_are_minimal(pairs, tmp_path, arch):
    base, tuned = pairs(arch)
    E = 0.8
    man = extract(base, tuned, tmp_path / "out", rank=f"energy:{E}", others="drop")
    D = differences(base, tuned, man["modules"])
    cfg = json.loads((tmp_path / "out" / "adapter_config.json").read_text())
    from peft.utils.other import get_pattern_key

    for m, rec in man["modules"].items():
        S2 = torch.linalg.svdvals(D[m]) ** 2
        minimal = int((torch.cumsum(S2, 0) < (E - 1e-12) * S2.sum()).sum()) + 1
        assert rec["kept_share"] >= E - 1e-12
        assert rec["rank_lower_bound"] <= minimal <= rec["rank"]
        if rec["method"] == "full":
            assert rec["minimal"] and rec["rank"] == minimal
        r = cfg["rank_pattern"].get(get_pattern_key(cfg["rank_pattern"].keys(), m), cfg["r"])
        assert r == rec["rank"]
    assert man["figures"]["minimal"] >= 1
    assert verify_output(tmp_path / "out")["passed"]


@pytest.mark.slow
def test_auto_rank_follows_its_rule_on_the_full_spectrum(pairs, tmp_path):
    from vecmerge.linalg.dense_cut import auto_rank

    base, tuned = pairs("qwen3")
    man = extract(base, tuned, tmp_path / "out", rank="auto", others="drop")
    D = differences(base, tuned, man["modules"])
    for m, rec in man["modules"].items():
        S = torch.linalg.svdvals(D[m])
        r, sigma, tau = auto_rank(S, float((S**2).sum()), *D[m].shape)
        assert rec["rank"] == r and rec["sigma"] == pytest.approx(sigma, rel=1e-9)
        assert all(float(s) > tau for s in S[:r]) and all(float(s) <= tau for s in S[r:])


@pytest.mark.slow
def test_others_are_listed_and_never_silent(pairs, tmp_path):
    base, tuned = pairs("qwen3")
    with pytest.raises(UsageError, match=r"tensors outside --targets differ .*model.norm.weight|lm_head"):
        extract(base, tuned, tmp_path / "refused", rank="4")
    assert not (tmp_path / "refused").exists()
    man = extract(base, tuned, tmp_path / "dropped", rank="4", others="drop")
    listed = {t["tensor"] for t in man["others"]["tensors"]}
    b, t = load_file(str(base / "model.safetensors")), load_file(str(tuned / "model.safetensors"))
    differing = {n for n in t if not torch.equal(t[n], b[n]) and n.rsplit(".", 1)[0] not in man["modules"]}
    assert listed == differing and "model.norm.weight" in listed
    sd = load_file(str(tmp_path / "dropped" / "adapter_model.safetensors"))
    assert all("lora_" in k for k in sd)


@pytest.mark.slow
def test_resized_vocabulary_saved_and_loadable(pairs, tmp_path):
    base, tuned = pairs("qwen3", resize=100)
    with pytest.raises(UsageError, match=r"resized: .*model.embed_tokens.weight \(96, 32\) -> \(100, 32\)"):
        extract(base, tuned, tmp_path / "x", rank="4")
    man = extract(base, tuned, tmp_path / "out", rank="1000", others="save")
    resized = {t["tensor"] for t in man["others"]["tensors"] if t["kind"] == "resized"}
    assert resized == {"model.embed_tokens.weight", "lm_head.weight"}
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = AutoModelForCausalLM.from_pretrained(base)
        model.resize_token_embeddings(100)
        model = PeftModel.from_pretrained(model, tmp_path / "out")
    ids = prompt(vocab=100)
    assert rel_max(logits(model, ids), logits(tuned, ids)) <= 1e-4
    assert verify_output(tmp_path / "out")["passed"]


@pytest.mark.slow
def test_save_refuses_what_peft_cannot_hold(pairs, tmp_path):
    base, tuned = pairs("gpt2")
    with pytest.raises(UsageError, match="belong to LoRA-targeted modules"):
        extract(base, tuned, tmp_path / "x", rank="4", others="save")
    with pytest.raises(UsageError, match="wte is tied to the output head"):
        extract(base, tuned, tmp_path / "x", rank="4", targets=["c_attn", "wte"], others="drop")
    assert not (tmp_path / "x").exists()


@pytest.mark.slow
def test_verify_catches_changed_inputs_and_outputs(pairs, tmp_path):
    import shutil

    base, tuned = pairs("qwen3")
    work = tmp_path / "tuned"
    shutil.copytree(tuned, work)
    extract(base, work, tmp_path / "out", rank="4", others="drop")
    w = tmp_path / "out" / "adapter_model.safetensors"
    sd = load_file(str(w))
    key = next(k for k in sd if "q_proj.lora_B" in k)
    sd[key] = sd[key] * 1.01
    from safetensors.torch import save_file

    save_file(sd, str(w), metadata={"format": "pt"})
    res = verify_output(tmp_path / "out")
    failed = {c["name"] for c in res["checks"] if not c["passed"]}
    assert {"output sha256", "update"} <= failed
    sd_t = load_file(str(work / "model.safetensors"))
    sd_t["model.norm.weight"] = sd_t["model.norm.weight"] + 1.0
    save_file(sd_t, str(work / "model.safetensors"), metadata={"format": "pt"})
    failed = {c["name"] for c in verify_output(tmp_path / "out")["checks"] if not c["passed"]}
    assert "inputs" in failed


@pytest.mark.slow
def test_cli_extract(pairs, tmp_path, run_cli):
    base, tuned = pairs("qwen3")
    r = run_cli("extract", "--base-model", base, "--tuned", tuned, "--rank", "energy:0.9", "--others", "drop",
                "--out", tmp_path / "o")
    assert r.exit_code == 0, r.output
    assert "kept share" in r.output and "DROPPED" in r.output
    r = run_cli("extract", "--base-model", base, "--tuned", tuned, "--rank", "3", "--out", tmp_path / "o2")
    assert r.exit_code == 2 and "--others save" in r.output and not (tmp_path / "o2").exists()
    r = run_cli("extract", "--base-model", base, "--tuned", tuned, "--rank", "3", "--others", "drop", "--out",
                tmp_path / "o")
    assert r.exit_code == 2 and "already exists" in r.output
    r = run_cli("extract", "--base-model", base, "--tuned", tuned, "--rank", "3", "--others", "drop", "--out",
                tuned / "inside")
    assert r.exit_code == 2 and "lies inside" in r.output
    r = run_cli("extract", "--base-model", base, "--tuned", tuned, "--rank", "exact", "--out", tmp_path / "o3")
    assert r.exit_code == 2 and "--rank" in r.output
    r = run_cli("extract", "--base-model", base, "--tuned", tuned, "--rank", "2", "--targets", "nope", "--others",
                "drop", "--out", tmp_path / "o4")
    assert r.exit_code == 2 and "match no 2-D weight" in r.output
    r = run_cli("verify", tmp_path / "o", "--json")
    assert r.exit_code == 0 and json.loads(r.output)["passed"]


# -- fast: hand-made safetensors folders (no transformers) -----------------------------------------
def write_model(root, tensors: dict, **config):
    from safetensors.torch import save_file

    root.mkdir(parents=True)
    (root / "config.json").write_text(json.dumps({"model_type": "llama", **config}))
    save_file(tensors, str(root / "model.safetensors"))
    return root


def small(seed=0, **extra) -> dict:
    g = torch.Generator().manual_seed(seed)
    sd = {"model.layers.0.q_proj.weight": torch.randn(12, 8, generator=g),
          "model.layers.0.norm.weight": torch.ones(8), "lm_head.weight": torch.randn(20, 8, generator=g)}
    sd.update(extra)
    return sd


def test_one_sided_tensors_are_listed_and_refused_under_save(tmp_path):
    b = small()
    t = {k: v.clone() for k, v in b.items() if k != "model.layers.0.norm.weight"}
    t["model.layers.0.q_proj.weight"] += 0.1
    t["extra.weight"] = torch.ones(3)
    base, tuned = write_model(tmp_path / "b", b), write_model(tmp_path / "t", t)
    with pytest.raises(UsageError, match=r"extra.weight, model.layers.0.norm.weight exist in only one model"):
        extract(base, tuned, tmp_path / "o", rank="2", others="save")
    man = extract(base, tuned, tmp_path / "o", rank="2", others="drop")
    assert {(o["tensor"], o["kind"]) for o in man["others"]["tensors"]} == {("extra.weight", "added"),
                                                                            ("model.layers.0.norm.weight", "removed")}
    assert verify_output(tmp_path / "o")["passed"]


def test_dtype_only_differences_are_not_changes_and_unchanged_targets_write_zero(tmp_path):
    b = small()
    t = {k: v.to(torch.float64) for k, v in b.items()}
    man = extract(write_model(tmp_path / "b", b), write_model(tmp_path / "t", t), tmp_path / "o", rank="2")
    assert man["others"]["tensors"] == []
    rec = man["modules"]["model.layers.0.q_proj"]
    assert rec["rank"] == 0 and rec["written_rank"] == 1 and rec["total_energy"] == 0.0
    sd = load_file(str(tmp_path / "o" / "adapter_model.safetensors"))
    assert all(float(v.abs().max()) == 0.0 for v in sd.values())
    assert verify_output(tmp_path / "o")["passed"]  # float64 tensors are read into memory the hash still reads


def test_extracting_a_model_from_itself_warns(tmp_path, run_cli):
    """``--tuned`` naming the base model (or an untouched copy) wrote a zero adapter without a word (stranger2)."""
    base = write_model(tmp_path / "b", small())
    r = run_cli("extract", "--base-model", base, "--tuned", base, "--rank", "2", "--out", tmp_path / "o")
    assert r.exit_code == 0, r.output
    assert "warning: --tuned equals --base-model in every tensor, so the adapter is zero" in r.output
    t = small()
    t["model.layers.0.q_proj.weight"] += 0.1
    r = run_cli("extract", "--base-model", base, "--tuned", write_model(tmp_path / "t", t), "--rank", "2", "--out",
                tmp_path / "o2")
    assert r.exit_code == 0 and "warning" not in r.output, r.output


def test_conv1d_and_linear_targets_are_not_mixed(tmp_path):
    g = torch.Generator().manual_seed(0)
    b = {"transformer.h.0.attn.c_attn.weight": torch.randn(8, 24, generator=g),
         "score.weight": torch.randn(2, 8, generator=g)}
    t = {k: v + 0.1 for k, v in b.items()}
    base, tuned = write_model(tmp_path / "b", b, model_type="gpt2"), write_model(tmp_path / "t", t, model_type="gpt2")
    with pytest.raises(UsageError, match="Conv1D .* and Linear"):
        extract(base, tuned, tmp_path / "o", rank="2")
    man = extract(base, tuned, tmp_path / "o", rank="2", targets=["c_attn"], others="drop")
    assert man["modules"]["transformer.h.0.attn.c_attn"]["shape"] == [24, 8]


def test_model_type_mismatch_is_refused(tmp_path):
    base = write_model(tmp_path / "b", small())
    tuned = write_model(tmp_path / "t", small(), model_type="qwen3")
    with pytest.raises(VecmergeError, match="model_type 'qwen3' differs"):
        extract(base, tuned, tmp_path / "o", rank="2")


@pytest.mark.slow
def test_sharded_base_and_single_file_fine_tune(tmp_path):
    """Different shard layouts: the base is read out of file order, so its hash takes a second pass."""
    from finetune import build, finetune, save

    model = build("qwen3")
    base = save(model, tmp_path / "base", max_shard_size="20KB")
    tuned = save(finetune(model), tmp_path / "tuned")
    assert (base / "model.safetensors.index.json").is_file() and (tuned / "model.safetensors").is_file()
    man = extract(base, tuned, tmp_path / "out", rank="1000", others="save")
    import hashlib

    for name, h in man["inputs"]["base"]["files"].items():
        assert h == hashlib.sha256((base / name).read_bytes()).hexdigest()
    ids = prompt()
    assert rel_max(logits(peft_model(base, tmp_path / "out"), ids), logits(tuned, ids)) <= 1e-4
    assert verify_output(tmp_path / "out")["passed"]


def test_run_refuses_an_extract_manifest(tmp_path, run_cli):
    b = small()
    t = {k: v + 0.5 for k, v in b.items()}
    extract(write_model(tmp_path / "b", b), write_model(tmp_path / "t", t), tmp_path / "o", rank="2", others="drop")
    r = run_cli("run", tmp_path / "o" / "vecmerge.json")
    assert r.exit_code == 2 and "records a 'vecmerge extract' output" in r.output
    r = run_cli("extract", "--base-model", tmp_path / "b", "--tuned", tmp_path / "t", "--rank", "2", "--targets",
                ",", "--out", tmp_path / "o2")
    assert r.exit_code == 2 and "no module names given" in r.output


def test_verify_of_an_edited_manifest_is_one_error(tmp_path):
    from vecmerge.errors import OutputError

    b = small()
    t = {k: v + 0.5 for k, v in b.items()}
    extract(write_model(tmp_path / "b", b), write_model(tmp_path / "t", t), tmp_path / "o", rank="2", others="drop")
    man = json.loads((tmp_path / "o" / "vecmerge.json").read_text())
    del man["inputs"]
    (tmp_path / "o" / "vecmerge.json").write_text(json.dumps(man))
    with pytest.raises(OutputError, match="not a complete extract manifest"):
        verify_output(tmp_path / "o")


def test_model_card_front_matter_names_the_base_model(tmp_path, run_cli):
    """Issue 16 item 1i: the extract's README.md opens with YAML front matter ``library_name: peft`` and no
    ``base_model`` (a local folder is not a hub id: the Hub refuses it, as project's cards do without
    --base-model-id), which parses as YAML even for a folder named with ``: `` and ``#``; the config keeps the
    local path; the heading names the fine-tune, the text both folders (relative to the workspace)."""
    import yaml

    b = small()
    t = {k: v + 0.5 for k, v in b.items()}
    base = write_model(tmp_path / "base: v1 #2", b)
    tuned = write_model(tmp_path / "tuned", t)
    r = run_cli("extract", "--base-model", base, "--tuned", tuned, "--rank", "2", "--others", "drop", "--out",
                tmp_path / "o")
    assert r.exit_code == 0, r.output
    card = (tmp_path / "o" / "README.md").read_text()
    assert card.startswith("---\n")
    front, body = card[4:].split("\n---\n", 1)
    meta = yaml.safe_load(front)
    assert meta["library_name"] == "peft" and "base_model" not in meta
    assert json.loads((tmp_path / "o" / "adapter_config.json").read_text())["base_model_name_or_path"] == str(
        base.resolve())
    assert {"lora", "vecmerge"} <= set(meta["tags"])
    assert body.lstrip("\n").splitlines()[0] == "# LoRA extracted from tuned"
    rel = [Path(os.path.relpath(f.resolve(), Path.cwd().resolve())).as_posix() for f in (tuned, base)]
    assert f"`{rel[0]}` of `{rel[1]}`" in body  # relative to the workspace (here the current folder)


def test_a_non_finite_value_is_never_written(tmp_path, run_cli):
    """Issue 23: ``extract --others save`` wrote a fine-tune's NaN norm weight with exit 0. Now it is refused
    naming the tensor (exit 2, one line) and nothing is written, in any dtype."""
    b = small()
    t = {k: v.clone() for k, v in b.items()}
    t["model.layers.0.q_proj.weight"] += 0.1
    t["model.layers.0.norm.weight"][3] = float("nan")
    base, tuned = write_model(tmp_path / "b", b), write_model(tmp_path / "t", t)
    for dtype in ("fp32", "bf16"):
        r = run_cli("extract", "--base-model", base, "--tuned", tuned, "--rank", "2", "--others", "save",
                    "--dtype", dtype, "--out", tmp_path / "o")
        assert r.exit_code == 2 and r.stderr.count("\n") == 1, r.output
        assert "tensor base_model.model.model.layers.0.norm.weight holds 1+ NaN/Inf" in r.stderr, r.stderr
        assert not (tmp_path / "o").exists() and [p.name for p in tmp_path.iterdir()] == ["b", "t"]
    r = run_cli("extract", "--base-model", base, "--tuned", tuned, "--rank", "2", "--others", "drop",
                "--out", tmp_path / "o")
    assert r.exit_code == 0, r.output  # the NaN is in no tensor written


def test_a_non_finite_difference_names_its_tensor_and_model(tmp_path):
    """Issue 23: a NaN in a targeted weight said "the difference has NaN/Inf entries; check both models"; now the
    tensor and the model holding the value are named."""
    b = small()
    t = {k: v.clone() for k, v in b.items()}
    t["model.layers.0.q_proj.weight"][2, 3] = float("nan")
    base, tuned = write_model(tmp_path / "b", b), write_model(tmp_path / "t", t)
    with pytest.raises(ModelError, match=r"tensor model.layers.0.q_proj.weight holds NaN/Inf values in --tuned "
                                         r".*t \(1 NaN/Inf value\(s\)\)"):
        extract(base, tuned, tmp_path / "o", rank="2", others="drop")
    with pytest.raises(ModelError, match=r"in --base-model .*t \(1 NaN/Inf"):
        extract(tuned, base, tmp_path / "o", rank="2", others="drop")
    assert not (tmp_path / "o").exists()
