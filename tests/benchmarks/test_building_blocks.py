"""Smoke test of the benchmark's building blocks on tiny shapes: the references agree with vecmerge.

No timing is asserted; ``make bench`` measures speed and memory.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_refs as br  # noqa: E402


def test_shapes_match_vecmerge_testing():
    from vecmerge.testing import llm_shapes

    s = br.SHAPES["qwen3-0.6b"]
    assert br.module_shapes("qwen3-0.6b") == llm_shapes(s["layers"], s["hidden"], s["intermediate"], s["heads"],
                                                        s["kv_heads"], s["head_dim"])
    assert len(br.module_shapes("llama3-70b")) == 80 * 7


def test_tiny_references_agree(tmp_path):
    pytest.importorskip("peft")
    root = br.make_data(tmp_path / "data", "tiny")
    out = tmp_path / "out"
    res = br.inproc(root, out)
    assert res["wall"] > 0 and res["alpha"] > 0
    assert br.make_data(root, "tiny") == root  # reused, not rewritten

    layer0 = [m for m in br.module_shapes("tiny") if m.startswith("model.layers.0.")]
    dense = br.dense_reference(root, out, layer0)
    assert set(dense) == set(layer0)
    for m, e in dense.items():
        assert e["rel_err"] < 1e-5, (m, e)
        assert e["cut_err"] < 1e-9, (m, e)  # the cut at our rank drops nothing: our rank is exact

    peft = br.peft_reference(root, out, "tiny", 1, layer0)
    for m, e in peft["modules"].items():
        assert e["svd"] < 1e-5 and e["cat"] < 1e-5, (m, e)

    floor = br.floor(root, tmp_path / "floor", out / br.WEIGHTS)
    assert floor["written"] >= (out / br.WEIGHTS).stat().st_size - 1024
    on_disk = sum((root / n / br.WEIGHTS).stat().st_size for n in br.INPUTS)
    assert 0.9 * on_disk < floor["read"] <= on_disk  # every tensor of the four inputs, headers excluded


def test_measure_reports_rusage(tmp_path):
    r = br.measure([sys.executable, "-c", "x = bytearray(50 * 2**20); print('{\"ok\": 1}')"])
    assert r["rc"] == 0 and br.last_json(r) == {"ok": 1}
    assert r["peak"] > 50 * 2**20


@pytest.mark.slow
def test_merge_rows_on_tiny_shapes(tmp_path):
    """bench_merges' measurements on a 1-layer tiny model: on modules this small both cuts are the optimal one
    (full SVDs), so ours matches PEFT's ties_svd / dare_ties_svd to float32 (rtol 1e-4) and the table renders."""
    pytest.importorskip("peft")
    import bench_merges as bm

    root = bm.make_data(tmp_path / "data", 1, "tiny")
    res = {"shape": "tiny", "layers": 1, "scale": 2.0, "runs": {}}
    for label, (method, space, kind) in bm.RUNS.items():
        o = bm.ours(root, tmp_path / label.replace(" ", "-"), method, space)
        p = bm.peft(root, tmp_path / kind, kind, 1, "tiny")
        c = bm.check(root, tmp_path / label.replace(" ", "-"), tmp_path / kind, method, space, 1, "tiny")["worst"]
        assert c["peft_over_optimal"] <= 1e-4
        if space == "full":
            assert c["ours_over_optimal"] <= 1e-6 and c["ours_vs_peft"] <= 1e-4, (label, c)
        res["runs"][label] = {"ours": {**o, "peak": 1}, "peft": {**p, "peak": 2}, "peft_kind": kind, "check": c}
    text = "\n".join(bm.rows(res))
    assert "| ties full vs `ties_svd` |" in text and "Targets (merges):" in text


def test_extract_bench_blocks_on_tiny_shapes(tmp_path, monkeypatch, run_cli):
    """bench_extract's building blocks on a 1-layer model of hidden 32 (no timing asserted): the synthetic pair differs
    only in the targets; ``reference`` gives the optimal rank-R error of float64 numpy's SVD (rel 1e-5: it runs a
    float32 SVD); ``adapter_errors`` of ``vecmerge extract --rank R`` equals the manifest's error (rel 1e-9, the same
    fp32 factors in float64) and, on the full-SVD path, the optimal one (rel 1e-5); ``plain_copy`` writes the same
    tensors; the table's worst-error column is max(ours / optimal) - 1."""
    import bench_extract as be
    import numpy as np
    import torch
    from safetensors.torch import load_file

    from vecmerge.io.model_folder import ModelFolder

    monkeypatch.setitem(be.SHAPES, "tiny", dict(hidden=32, inter=48, heads=4, kv=2, head_dim=8, vocab=64, layers=4,
                                                rank=4, sample=1))
    s, rank = be.SHAPES["tiny"], 4
    monkeypatch.chdir(tmp_path)
    data = tmp_path / "data"
    be.make_data(data, "tiny", 1)
    stamp = (data / "done-tiny-1").stat().st_mtime_ns
    be.make_data(data, "tiny", 1)
    assert (data / "done-tiny-1").stat().st_mtime_ns == stamp  # reused, not rewritten
    names = [f"model.layers.0.{k}.weight" for k in be.module_shapes(s)]
    D = {}
    with ModelFolder(data / "base") as b, ModelFolder(data / "tuned") as t:
        index = json.loads((data / "base" / "model.safetensors.index.json").read_text())["weight_map"]
        assert len(index) == 7 + 2 + 3 and set(names) <= set(index)  # targets, 2 layer norms, embed, norm, head
        for name in index:
            x, y = b.read(name), t.read(name)
            assert x.dtype == y.dtype == torch.bfloat16
            if name in names:
                D[name] = y.double() - x.double()
                assert float(D[name].norm()) > 0, name
            else:  # norms, embeddings and lm_head: equal in both
                assert torch.equal(x, y), name

    ref = be.reference(data, names, rank)
    for n in names:
        S = np.linalg.svd(D[n].numpy(), compute_uv=False)
        want = math.sqrt((S[rank:] ** 2).sum() / (S**2).sum())
        assert ref[n]["optimal_rel_error"] == pytest.approx(want, rel=1e-5), n

    res = run_cli("extract", "--base-model", data / "base", "--tuned", data / "tuned", "--rank", rank, "--out", "lora")
    assert res.exit_code == 0, res.output
    man = json.loads((tmp_path / "lora" / "vecmerge.json").read_text())["modules"]
    errors = be.adapter_errors(data, tmp_path / "lora", names)
    for n in names:
        m = man[n.removesuffix(".weight")]
        assert m["method"] == "full" and errors[n] == pytest.approx(m["rel_error"], rel=1e-9), n
        assert errors[n] == pytest.approx(ref[n]["optimal_rel_error"], rel=1e-5), n

    copied = be.plain_copy(data / "base", tmp_path / "copy", hashed=True)
    shards = sorted((data / "base").glob("*.safetensors"))
    assert copied["bytes"] == sum((tmp_path / "copy" / p.name).stat().st_size for p in shards)
    for p in shards:
        x, y = load_file(p), load_file(tmp_path / "copy" / p.name)
        assert x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)
    for p in (data / "base").glob("*.json"):
        assert (tmp_path / "copy" / p.name).read_bytes() == p.read_bytes()

    run = {"wall": 1.0, "cpu": 1.0, "peak": 2 * 2**30}
    row = {"shape": "tiny", "spec": s, "layers_sampled": 1, "layers_full": 4, "scale": 4.0, "startup": run,
           "extract": {**run, "rel_error": {n.removesuffix(".weight"): man[n.removesuffix(".weight")]["rel_error"]
                                            for n in names}},
           "reference": ref, "fuse": run, "copy": run, "copy_hashed": run}
    worst = max(man[n.removesuffix(".weight")]["rel_error"] / ref[n]["optimal_rel_error"] for n in names) - 1
    assert be.render([row]).splitlines()[2].split(" | ")[7] == f"{worst:+.3%}"
    q = "model.layers.0.self_attn.q_proj"  # one module 1.5% above its optimal error: the column shows it
    row["extract"]["rel_error"][q] = 1.015 * ref[f"{q}.weight"]["optimal_rel_error"]
    assert be.render([row]).splitlines()[2].split(" | ")[7] == "+1.500%"


@pytest.mark.slow
def test_probe_bench_runs_tiny_and_agrees_with_peft(tmp_path, capsys):
    """``bench_probe.py --tiny``: every run completes and the probe's logliks equal the naive PEFT loop's."""
    import bench_probe as bp

    assert bp.main(["--tiny", "--out", str(tmp_path), "--adapters", "2", "--prompts", "5", "--vocab", "64",
                    "--layers", "1", "--batch", "2"]) == 0
    res = json.loads((tmp_path / "probe.json").read_text())
    assert set(res["seconds"]) == {"bare", "probe", "probe_no_pairs", "naive", "naive_once"}
    assert res["worst_gap"] < 1e-5 and "| probe (pairs) |" in (tmp_path / "probe.md").read_text()


def test_spectral_rows_on_tiny_shapes(tmp_path):
    """bench_spectral's two sides on a tiny module agree (the factored merges equal their dense definitions to
    fp32 rounding, rtol 1e-6) and the table renders."""
    pytest.importorskip("peft")
    import bench_spectral as bs

    root = bs.make_data(tmp_path / "data", "tiny", 4)
    rows = []
    for label in bs.METHODS:
        f = bs.factored(root, tmp_path / f"{label}-f", label, "self_attn.q_proj")
        d = bs.dense(root, tmp_path / f"{label}-d", label, "self_attn.q_proj")
        c = bs.check(tmp_path / f"{label}-f", tmp_path / f"{label}-d")
        assert c["rel"] <= 1e-6, (label, c)
        rows.append({"method": label, "module": "self_attn.q_proj", "shape": (64, 64), "factored": {**f, "peak": 1},
                     "dense": {**d, "peak": 1}, "check": c})
    text = "\n".join(bs.rows({"shape": "tiny", "rank": 4, "rows": rows}))
    assert "| tsv_m | q_proj (64 x 64) |" in text and "| knots ties |" in text
