"""Smoke test of the benchmark's building blocks on tiny shapes: the references agree with vecmerge.

No timing is asserted; ``make bench`` measures speed and memory.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
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
