"""`vecmerge audit`: per-module agreement against a dense reference, the chance band, views, JSON, plots, pairwise."""

import csv
import io
import json
import math
import sys

import numpy as np
import pytest
import torch
from scipy.stats import binomtest, ortho_group

from vecmerge.analysis import audit, consensus
from vecmerge.errors import VecmergeError
from vecmerge.linalg.lowrank import LowRank
from vecmerge.report import audit as report_audit
from vecmerge.testing import QWEN3_TYPES, llm_shapes, toy_trajectory, write_peft_folder
from vecmerge.workspace.names import Workspace

REF, DIR = "v54 - v54e2", "v51 - v28"
TYPES = list(QWEN3_TYPES)
# 28 layers x 7 types = the user's 196 modules, at tiny widths so the suite stays fast.
TINY28 = llm_shapes(28, 8, 12, 2, 1, 4)


def _audit(ref=None, direction=None, adapters=None, **kw):
    if adapters:
        return audit.audit_pairwise(Workspace(), adapters, **kw)
    kw.setdefault("samples", 200)
    return audit.audit_trajectories(Workspace(), ref, direction, **kw)


def _at(root, monkeypatch, **kw):
    toy_trajectory(root, **kw)
    monkeypatch.chdir(root)


def test_rows_match_dense_reference(toy):
    res = _audit(ref=REF, direction=DIR)
    ws = Workspace()
    ref, d = ws.evaluate(REF), ws.evaluate(DIR)
    assert [r["module"] for r in res["rows"]] == d.names() and len(res["rows"]) == 14
    for r in res["rows"]:
        R, D = ref[r["module"]].dense(), d[r["module"]].dense()
        want = torch.tensor([(R * D).sum(), R.norm(), D.norm(), (R * D).sum() / (R.norm() * D.norm())])
        got = torch.tensor([r["inner"], r["ref_norm"], r["dir_norm"], r["cosine"]], dtype=torch.float64)
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-14)
        sp = ref[r["module"]].singular_values()
        torch.testing.assert_close(sp, torch.linalg.svdvals(R)[: len(sp)], rtol=1e-9, atol=1e-12 * float(sp[0]))
        assert r["agree"] is (r["inner"] > 0) and r["layer"] in (0, 1) and r["type"] in TYPES
        assert r["shape"] == list(D.shape)
        assert r["null_std"] == pytest.approx(1 / math.sqrt(D.numel()), rel=1e-12)
    s = res["summary"]
    assert (s["modules"], s["agree"], s["disagree"], s["disagreeing"]) == (14, 14, 0, [])
    assert s["agree_energy"] == pytest.approx(1.0, abs=0) and s["chance"] == 0
    dense_global = sum(float((ref[m].dense() * d[m].dense()).sum()) for m in d) / (ref.norm() * d.norm())
    assert s["global_cosine"] == pytest.approx(dense_global, rel=1e-10)


def test_negated_ref_flips_every_sign(toy):
    a, b = _audit(ref=REF, direction=DIR), _audit(ref="v54e2 - v54", direction=DIR)
    flip = {"agree": "disagree", "disagree": "agree", "chance": "chance"}
    for x, y in zip(a["rows"], b["rows"]):
        assert y["agree"] is not x["agree"] and y["inner"] == pytest.approx(-x["inner"], rel=1e-12)
        assert y["cosine"] == pytest.approx(-x["cosine"], rel=1e-12)
        assert y["null_band"] == pytest.approx(x["null_band"], rel=1e-10) and y["mark"] == flip[x["mark"]]
    assert (b["summary"]["agree"], b["summary"]["disagree"]) == (0, 14)
    assert b["summary"]["agree_energy"] == 0.0 and len(b["summary"]["disagreeing"]) == 14


def test_disagreeing_module_is_named_and_binomial_p_matches_scipy(tmp_path, monkeypatch):
    bad = "model.layers.1.mlp.up_proj"
    _at(tmp_path / "t", monkeypatch, disagree=(bad,))
    s = _audit(ref=REF, direction=DIR)["summary"]
    assert (s["agree"], s["disagreeing"], s["disagree_significant"]) == (13, [bad], 1)
    assert s["binom_p"] == pytest.approx(binomtest(13, 14, 0.5, alternative="greater").pvalue, rel=1e-12)
    for k, n in [(196, 196), (120, 196), (98, 196), (0, 5), (3, 3), (7, 20)]:
        want = binomtest(k, n, 0.5, alternative="greater").pvalue
        assert consensus.binom_tail(k, n) == pytest.approx(want, rel=1e-12)


def test_chance_marks_unrelated_but_not_related(tmp_path, monkeypatch):
    _at(tmp_path / "unrel", monkeypatch, shapes=TINY28, rank=2, unrelated=True)
    s = _audit(ref=REF, direction=DIR)["summary"]
    assert s["modules"] == 196 and s["chance"] >= 0.85 * 196  # ~95% expected at a two-sided 5% band
    assert s["binom_p"] > 0.01 and abs(s["global_z"]) < 4
    _at(tmp_path / "rel", monkeypatch, shapes=TINY28, rank=2)
    res = _audit(ref=REF, direction=DIR)
    s = res["summary"]
    assert s["chance"] <= 0.05 * 196 and s["agree_significant"] >= 0.95 * 196 and s["binom_p"] < 1e-50
    text = report_audit.render(res)
    assert "196/196 modules agree" in text and "sign test: p = " in text


def test_null_band_matches_dense_rotations_and_analytic_std():
    g = torch.Generator().manual_seed(3)
    out, inn = 7, 5
    R = torch.randn(out, 2, generator=g, dtype=torch.float64) @ torch.randn(2, inn, generator=g, dtype=torch.float64)
    D = torch.randn(out, 3, generator=g, dtype=torch.float64) @ torch.randn(3, inn, generator=g, dtype=torch.float64)
    n = 4000
    Q1 = torch.from_numpy(ortho_group.rvs(out, size=n, random_state=4))
    Q2 = torch.from_numpy(ortho_group.rvs(inn, size=n, random_state=5))
    dense = ((Q1 @ R @ Q2.transpose(1, 2)) * D).sum((1, 2)) / (R.norm() * D.norm())
    ours = audit.null_cosines([(out, inn)], [(torch.linalg.svdvals(R), torch.linalg.svdvals(D))], n)[0]
    std = 1 / math.sqrt(out * inn)  # exact for Haar rotations at any rank
    for x in (ours, dense):  # Monte Carlo tolerance: about 4 standard errors at n = 4000
        torch.testing.assert_close(x.std(), torch.tensor(std, dtype=torch.float64), rtol=0.05, atol=0)
    for q in (0.5, 0.9, 0.95):
        torch.testing.assert_close(torch.quantile(ours.abs(), q), torch.quantile(dense.abs(), q), rtol=0.06, atol=0)
    # A large rank-32 pair is Gaussian: the sampled 95% band sits at 1.96 sigma.
    s = torch.linspace(1, 0.5, 32, dtype=torch.float64)
    big = audit.null_cosines([(2048, 1024)], [(s, s.flip(0))], 4000)[0]
    torch.testing.assert_close(torch.quantile(big.abs(), 0.95) * math.sqrt(2048 * 1024),
                               torch.tensor(audit.Z_CRIT, dtype=torch.float64), rtol=0.05, atol=0)


@pytest.mark.parametrize("n,rows,cols", [(6, 2, 3), (4, 2, 3), (3, 3, 3), (40, 10, 12)])
def test_haar_blocks_have_haar_moments(n, rows, cols):
    M = audit.haar_blocks(n, rows, cols, 40000, torch.Generator().manual_seed(0), np.random.default_rng(0))
    torch.testing.assert_close((M**2).mean(), torch.tensor(1 / n, dtype=torch.float64), rtol=0.02, atol=0)
    fourth = 3 / (n * (n + 2))  # E[O_11^4] for Haar O(n)
    torch.testing.assert_close((M[:, 0, 0] ** 4).mean(), torch.tensor(fourth, dtype=torch.float64), rtol=0.1, atol=0)


def test_sampled_band_is_the_stated_quantile_of_its_null(toy):
    """null_band is the (1 - LEVEL) quantile of |null cosine| over the seeded draws, module by module."""
    ws = Workspace()
    ref, d = ws.evaluate(REF), ws.evaluate(DIR)
    rows, spectra = consensus.measure(ref, d, d.names())
    audit.mark_chance(rows, spectra, samples=300)
    nulls = audit.null_cosines([r["shape"] for r in rows], spectra, 300)
    for r, null in zip(rows, nulls):
        assert r["null_band"] == float(torch.quantile(null.abs(), 1.0 - audit.LEVEL))
        assert r["null_band"] != float(torch.quantile(null.abs(), 1.0 - audit.LEVEL / 2))


def test_analytic_band_when_samples_zero(toy):
    res = _audit(ref=REF, direction=DIR, samples=0)
    assert res["summary"]["null_method"] == "analytic" and res["summary"]["samples"] == 0
    for r in res["rows"]:
        assert r["null_band"] == pytest.approx(audit.Z_CRIT / math.sqrt(r["shape"][0] * r["shape"][1]), rel=1e-12)


def test_grid_layout_and_views(tmp_path, monkeypatch, run_cli):
    _at(tmp_path / "t", monkeypatch, shapes=llm_shapes(3, 16, 24, 2, 1, 8), disagree=("model.layers.2.mlp.up_proj",))
    res = _audit(ref=REF, direction=DIR)
    gr = report_audit.grid(res["rows"])
    assert gr["layers"] == [0, 1, 2] and gr["types"] == TYPES and gr["unplaced"] == []
    assert gr["mark"][2][TYPES.index("up_proj")] == "disagree" and gr["cosine"][2][5] < 0
    out = run_cli("audit", "--ref", REF, "--dir", DIR, "--by", "grid").output.splitlines()
    assert out[0].split() == ["layer", *TYPES] and [ln.split()[0] for ln in out[2:5]] == ["0", "1", "2"]
    assert out[4].split()[2 * 5 + 2] == "x" and "x disagree" in "\n".join(out)
    rows = list(csv.reader(io.StringIO(run_cli("audit", "--ref", REF, "--dir", DIR, "--by", "grid",
                                               "--format", "csv").output)))
    assert rows[0][:3] == ["layer", "q_proj", "q_proj_mark"] and len(rows) == 4 and rows[3][12] == "disagree"
    for by, n in (("layer", 3), ("type", 7)):
        body = list(csv.DictReader(io.StringIO(report_audit.render(res, by=by, fmt="csv"))))
        assert len(body) == n and sum(int(b["agree"]) for b in body) == res["summary"]["agree"]
        assert sum(int(b["agree_significant"]) for b in body) == res["summary"]["agree_significant"]
    by_cos = list(csv.DictReader(io.StringIO(report_audit.render(res, sort="cosine", fmt="csv"))))
    cos = [float(b["cosine"]) for b in by_cos]
    assert cos == sorted(cos) and by_cos[0]["module"] == "model.layers.2.mlp.up_proj"
    md = report_audit.render(res, by="type", fmt="markdown")
    assert "| type" in md and "|--" in md and "- 20/21 modules agree in sign" in md


def test_json_schema(toy, run_cli):
    res = run_cli("audit", "--ref", REF, "--dir", DIR, "--format", "json", "--by", "layer")
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert (data["kind"], data["ref"], data["dir"], data["view"], data["missing"]) == ("audit", REF, DIR, "layer", {})
    s = data["summary"]
    types = {"modules": int, "agree": int, "disagree": int, "agree_energy": float, "cosine_median": float,
             "cosine_min": float, "disagreeing": list, "chance": int, "agree_significant": int,
             "disagree_significant": int, "binom_p": float, "binom_p_significant": float, "global_cosine": float,
             "global_z": float, "null_method": str, "samples": int, "level": float}
    assert all(isinstance(s[k], t) for k, t in types.items()), s
    row_types = {"module": str, "layer": int, "type": str, "shape": list, "inner": float, "cosine": float,
                 "ref_norm": float, "dir_norm": float, "agree": bool, "null_std": float, "z": float,
                 "null_band": float, "chance": bool, "mark": str}
    assert len(data["rows"]) == 14
    for r in data["rows"]:
        assert all(isinstance(r[k], t) for k, t in row_types.items()), r
        assert r["module"].startswith("model.layers.") and r["mark"] in ("agree", "disagree", "chance")
    assert [x["layer"] for x in data["layers"]] == [0, 1] and sum(x["modules"] for x in data["layers"]) == 14


def test_plot_writes_a_png(toy, run_cli, tmp_path):
    import matplotlib.image

    for args, name in ((["--ref", REF, "--dir", DIR], "audit.png"), (["v28", "v51", "v54"], "pairs.png")):
        path = tmp_path / name
        res = run_cli("audit", *args, "--plot", path)
        assert res.exit_code == 0, res.output
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 2000
        h, w, c = matplotlib.image.imread(str(path)).shape
        assert h > 100 and w > 200 and c in (3, 4)


def test_plot_without_matplotlib(toy, monkeypatch, tmp_path, run_cli):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(VecmergeError, match=r"--plot needs matplotlib: pip install 'vecmerge\[plot\]'"):
        report_audit.plot(_audit(ref=REF, direction=DIR, samples=0), tmp_path / "x.png")
    res = run_cli("audit", "--ref", REF, "--dir", DIR, "--plot", tmp_path / "x.png")
    assert res.exit_code == 2 and "error: --plot needs matplotlib" in res.output


def test_pairwise_matrix(toy, run_cli):
    labels = ["v28", "v51", "v54e2", "v54"]
    p = _audit(adapters=labels)["pairwise"]
    cos = torch.tensor(p["cosine"], dtype=torch.float64)
    torch.testing.assert_close(cos, cos.T, rtol=0, atol=0)
    torch.testing.assert_close(cos.diagonal(), torch.ones(4, dtype=torch.float64), rtol=1e-12, atol=0)
    assert p["labels"] == labels and [p["agree"][i][i] for i in range(4)] == [14] * 4
    assert p["agree"] == [list(x) for x in zip(*p["agree"])]
    ws = Workspace()
    a, b = ws.vector("v28"), ws.vector("v54")
    dense = sum(float((a[m].dense() * b[m].dense()).sum()) for m in a)
    dn = math.sqrt(sum(float((a[m].dense() ** 2).sum()) for m in a) * sum(float((b[m].dense() ** 2).sum()) for m in b))
    assert p["cosine"][0][3] == pytest.approx(dense / dn, rel=1e-10)
    text = run_cli("audit", *labels).output
    assert "cosine" in text and "14/14" in text
    pairs = list(csv.DictReader(io.StringIO(run_cli("audit", *labels, "--format", "csv").output)))
    assert len(pairs) == 6 and {(x["a"], x["b"]) for x in pairs} >= {("v28", "v51"), ("v54e2", "v54")}


def test_missing_modules(toy, run_cli):
    ws = Workspace()
    v = ws.vector("v54")
    keep = {m: (v[m].B, v[m].A) for m in v.names() if m != "model.layers.0.mlp.up_proj"}
    write_peft_folder("v54part", keep, r=8, lora_alpha=8)
    res = run_cli("audit", "--ref", "v54part - v54e2", "--dir", DIR)
    assert res.exit_code == 2 and "--allow-missing" in res.output
    out = _audit(ref="v54part - v54e2", direction=DIR, allow_missing=True)
    assert out["missing"] == {"v54part": ["model.layers.0.mlp.up_proj"]} and out["summary"]["modules"] == 14


@pytest.mark.parametrize("args,msg", [
    ((), "audit: nothing to audit; pass --ref EXPR --dir EXPR, or two or more ADAPTERS"),
    (("v54",), "audit: only one adapter (v54)"),
    (("--ref", REF), "audit: --ref needs --dir too"),
    (("--dir", DIR), "audit: --dir needs --ref too"),
    (("--ref", REF, "--dir", DIR, "v28"), "not both"),
    (("--ref", REF, "--dir", DIR, "--samples", "-1"), "--samples -1: give 0"),
    (("--ref", "v54 - v54", "--dir", DIR), "--ref v54 - v54: is zero in every module (the expression cancels)"),
    (("--ref", REF, "--dir", "0*v51"), "--dir 0*v51: is zero in every module"),
])
def test_usage_errors(toy, run_cli, args, msg):
    res = run_cli("audit", *args)
    assert res.exit_code == 2 and res.output.startswith("error: ") and msg in res.output
    assert len(res.output.strip().splitlines()) == 1


def test_library_refuses_negative_samples(toy):
    with pytest.raises(VecmergeError, match="samples=-1: give 0"):
        _audit(ref=REF, direction=DIR, samples=-1)


def test_zero_module_is_marked_zero_and_not_compared(toy):
    ws = Workspace()
    ref, d = ws.evaluate(REF), ws.evaluate(DIR)
    m = d.names()[0]
    ref.modules[m] = LowRank.zeros(ref[m].shape)
    rows, spectra = consensus.measure(ref, d, d.names(), None)
    audit.mark_chance(rows, spectra, samples=50)
    assert (rows[0]["cosine"], rows[0]["agree"], rows[0]["mark"], rows[0]["zero"]) == (0.0, False, "zero", True)
    assert all(r["mark"] == "agree" for r in rows[1:])
    s = consensus.summarize(rows)
    assert (s["agree"], s["disagree"], s["chance"], s["not_compared"], s["zero"]) == (len(rows) - 1, 0, 0, 1, 1)


def test_a_module_the_direction_lacks_is_missing_with_zero_figures(toy):
    """When every adapter of the *direction* lacks a module (``--allow-missing``), its row is missing with
    dir_norm, inner and cosine 0 (the direction has no layout for it), and every other row equals the full
    audit's (the same factors; rel 1e-12)."""
    ws = Workspace()
    m = "model.layers.1.self_attn.v_proj"
    for name in ("v51", "v28"):
        v = ws.vector(name)
        write_peft_folder(f"{name}part", {k: (v[k].B, v[k].A) for k in v.names() if k != m}, r=8, lora_alpha=8)
    full = _audit(ref=REF, direction=DIR, samples=0)
    part = _audit(ref=REF, direction="v51part - v28part", allow_missing=True, samples=0)
    assert part["missing"] == {"v51part": [m], "v28part": [m]}
    s = part["summary"]
    assert (s["modules"], s["not_compared"], s["agree"] + s["disagree"]) == (14, 1, 13)
    for a, b in zip(part["rows"], full["rows"]):
        assert (a["module"], a["type"], a["shape"]) == (b["module"], b["type"], b["shape"])
        if a["module"] == m:
            assert (a["dir_norm"], a["inner"], a["cosine"], a["agree"], a["mark"]) == (0.0, 0.0, 0.0, False, "missing")
            assert a["ref_norm"] == pytest.approx(b["ref_norm"], rel=1e-12)
        else:
            assert a["cosine"] == pytest.approx(b["cosine"], rel=1e-12) and a["mark"] == b["mark"]


@pytest.mark.slow
def test_grid_keeps_every_module_of_a_real_gpt2(tmp_path, monkeypatch, hf_base, peft_on, dense_updates, run_cli):
    """Issue 12 item 4: attn.c_proj and mlp.c_proj are two columns, embedding LoRA a row; each cell is the
    dense float64 cosine of its one module (rtol 1e-9)."""
    gpt2 = hf_base("gpt2")
    targets = ["c_attn", "attn.c_proj", "mlp.c_proj", "c_fc", "wte"]
    for name, seed in (("g1", 1), ("g2", 2), ("g3", 3)):
        peft_on(gpt2, tmp_path / name, seed, target_modules=targets, fan_in_fan_out=True)
    monkeypatch.chdir(tmp_path)
    res = audit.audit_trajectories(Workspace(), "g1 - g3", "g2 - g3", samples=0)
    gr = report_audit.grid(res["rows"])
    assert gr["types"] == ["c_attn", "attn.c_proj", "c_fc", "mlp.c_proj", "wte"]
    assert gr["layers"] == [0, 1, None] and gr["unplaced"] == ["transformer.wte"]
    d1, d2, d3 = (dense_updates(n) for n in ("g1", "g2", "g3"))
    cells = {}
    for i, layer in enumerate(gr["layers"]):
        for j, t in enumerate(gr["types"]):
            if gr["cosine"][i][j] is not None:
                cells[(layer, t)] = gr["cosine"][i][j]
    assert len(cells) == len(res["rows"]) == 9  # no module dropped, none sharing a cell
    for r in res["rows"]:
        m = r["module"]
        R, D = d1[m] - d3[m], d2[m] - d3[m]
        want = float((R * D).sum() / (R.norm() * D.norm()))
        assert cells[(r["layer"], r["type"])] == pytest.approx(want, rel=1e-9)
    text = run_cli("audit", "--ref", "g1 - g3", "--dir", "g2 - g3", "--by", "grid", "--samples", "0").output
    head = text.splitlines()[0].split()
    assert head == ["layer", *gr["types"]] and "no layer" in text
    types = list(csv.DictReader(io.StringIO(report_audit.render(res, by="type", fmt="csv"))))
    assert [t["type"] for t in types] == gr["types"] and sum(int(t["modules"]) for t in types) == 9
    assert run_cli("audit", "--ref", "g1 - g3", "--dir", "g2 - g3", "--plot", tmp_path / "h.png").exit_code == 0
    info = json.loads(run_cli("inspect", "g1", "--json").stdout)
    assert set(info["norm_by_type"]) == set(gr["types"])


def test_missing_modules_are_counted_apart(toy, run_cli):
    """Issue 12 item 6: modules an input lacks are neither agreeing nor disagreeing; the sign test runs over the
    compared modules (p-value against scipy's exact binomial test)."""
    ws = Workspace()
    v = ws.vector("v54")
    gone = ["model.layers.0.mlp.up_proj", "model.layers.0.mlp.down_proj", "model.layers.1.self_attn.q_proj",
            "model.layers.1.mlp.gate_proj"]
    write_peft_folder("v54part", {m: (v[m].B, v[m].A) for m in v.names() if m not in gone}, r=8, lora_alpha=8)
    res = _audit(ref="v54part - v54e2", direction=DIR, allow_missing=True)
    s = res["summary"]
    assert (s["modules"], s["not_compared"], s["agree"] + s["disagree"]) == (14, 4, 10)
    assert s["agree"] == 10 and s["disagree"] == 0 and s["disagreeing"] == []
    assert s["binom_p"] == pytest.approx(binomtest(10, 10, 0.5, alternative="greater").pvalue, rel=1e-12)
    assert sorted(r["module"] for r in res["rows"] if r["mark"] == "missing") == sorted(gone)
    text = run_cli("audit", "--ref", "v54part - v54e2", "--dir", DIR, "--allow-missing", "--by", "grid").output
    assert "10/10 modules agree in sign" in text and "not compared: 4 module(s)" in text and "? missing" in text
    pairs = _audit(adapters=["v54part", "v54"], allow_missing=True)["pairs"]
    assert (pairs[0]["compared"], pairs[0]["agree"], pairs[0]["modules"]) == (10, 10, 14)
    assert "10/10" in run_cli("audit", "v54part", "v54", "--allow-missing").output


def test_sign_agreement_and_agreement_beyond_chance_have_different_names(tmp_path, monkeypatch, run_cli):
    """Issue 12 item 8: same sign (``agree``) and beyond chance (``agree_significant``) are two columns that add
    up to the summary's two counts; the heatmap title reads ref before dir, like the summary."""
    _at(tmp_path / "u", monkeypatch, unrelated=True, shapes=llm_shapes(3, 16, 24, 2, 1, 8))
    res = _audit(ref=REF, direction=DIR)
    s = res["summary"]
    assert s["agree"] != s["agree_significant"]  # unrelated steps: many same-sign modules lie within chance
    body = list(csv.DictReader(io.StringIO(report_audit.render(res, by="type", fmt="csv"))))
    assert sum(int(b["agree"]) for b in body) == s["agree"]
    assert sum(int(b["agree_significant"]) for b in body) == s["agree_significant"]
    assert sum(int(b["chance"]) for b in body) == s["chance"]
    head = run_cli("audit", "--ref", REF, "--dir", DIR, "--by", "layer").output.splitlines()[0].split()
    assert head[:6] == ["layer", "modules", "same_sign", "agree_beyond", "disagree_beyond", "chance"]
    text = run_cli("audit", "--ref", REF, "--dir", DIR).output
    assert f"{s['agree']}/21 modules agree in sign" in text and f"beyond chance {s['agree_significant']} agree" in text
    title = report_audit.heatmap_title(res)
    assert title.startswith(f"ref {REF} vs dir {DIR}: {s['agree']}/21 same sign")


def _spectrum(values):
    return torch.tensor(values, dtype=torch.float64)


def test_null_with_a_tail_beyond_the_sampled_rank_keeps_the_exact_variance():
    """Pairs beyond ``rank`` enter as a Gaussian of exactly their variance, so Var(null) = 1/(out in) at any rank.

    The reference is the Haar-rotation identity (exact for every spectrum); the tail shares of the two sides
    differ (3/4 of ||ref||^2, 2% of ||dir||^2; then 3/4 and 1/2, both ways round, where the two tails overlap
    most) and out != in, so the tail's formula, its sides and its scale all show
    (``test_null_band_matches_dense_rotations_and_analytic_std`` compares untruncated nulls with dense
    rotations). Monte Carlo tolerance: rtol 0.05 on the std, atol 4 standard errors on the mean, at 4000 draws.
    """
    out, inn = 6, 5
    s, t = _spectrum([2.0, 1.5, 1.0, 0.5]), _spectrum([1.0, 0.1, 0.1])
    flat, half = _spectrum([1.0, 1.0, 1.0, 1.0]), _spectrum([1.0, 1.0])  # at rank 1: tails of 3/4 and 1/2
    std = 1 / math.sqrt(out * inn)
    for (a, b), rank in (((s, t), 1), ((s, t), 2), ((flat, half), 1), ((half, flat), 1)):
        null = audit.null_cosines([(out, inn)], [(a, b)], 4000, seed=1, rank=rank)[0]
        assert null.dtype == torch.float64 and null.shape == (4000,)
        torch.testing.assert_close(null.std(), torch.tensor(std, dtype=torch.float64), rtol=0.05, atol=0)
        torch.testing.assert_close(null.mean(), torch.tensor(0.0, dtype=torch.float64), rtol=0, atol=4 * std / 60)


def test_null_draws_are_seeded_and_zero_where_a_side_is_zero():
    """The same seed gives the same draws (tail included), another seed others; a zero side gives float64 zeros."""
    s, t = _spectrum([2.0, 1.0, 0.5]), _spectrum([1.0, 0.5, 0.2])
    shapes = [(7, 5), (7, 5), (7, 5), (7, 5), (4, 3)]
    spectra = [(s, t), (s * 0, t), (s, t * 0), (s[:0], t), (t, s)]
    a = audit.null_cosines(shapes, spectra, 50, seed=4, rank=1)
    b = audit.null_cosines(shapes, spectra, 50, seed=4, rank=1)
    c = audit.null_cosines(shapes, spectra, 50, seed=5, rank=1)
    for x, y in zip(a, b):
        assert torch.equal(x, y)
    assert not torch.equal(a[0], c[0]) and not torch.equal(a[4], c[4])
    for i in (1, 2, 3):
        assert a[i].dtype == torch.float64 and torch.equal(a[i], torch.zeros(50, dtype=torch.float64))
    assert bool((a[0] != 0).all()) and bool((a[4] != 0).all())


def test_mark_chance_figures_and_its_boundary():
    """``z = cos * sqrt(out in)``; the band is the (1 - LEVEL) quantile of null_cosines with the same seed and
    (by default) 200 draws; ``chance`` is strict (``|cos| < band``): a cosine exactly at the band is not chance.
    Exact equalities: the same float64 numbers are recomputed."""
    s, t = _spectrum([2.0, 1.0]), _spectrum([1.0, 0.5])

    def row(cos, ref_norm=1.0, dir_norm=1.0):
        return {"shape": [7, 5], "cosine": cos, "ref_norm": ref_norm, "dir_norm": dir_norm, "agree": cos > 0}

    for seed, samples in ((7, 120), (audit.SEED, None)):
        rows = [row(0.3), row(-0.05)]
        kw = {} if samples is None else {"samples": samples}
        audit.mark_chance(rows, [(s, t), (t, s)], seed=seed, **kw)
        nulls = audit.null_cosines([[7, 5], [7, 5]], [(s, t), (t, s)], samples or 200, seed)
        for r, null in zip(rows, nulls):
            assert r["null_band"] == float(torch.quantile(null.abs(), 1.0 - audit.LEVEL))
            assert r["z"] == pytest.approx(r["cosine"] * math.sqrt(35), rel=1e-15)
            assert r["null_std"] == pytest.approx(1 / math.sqrt(35), rel=1e-15)
    band = audit.Z_CRIT / math.sqrt(35)
    rows = audit.mark_chance([row(band), row(-band), row(band * (1 - 1e-15))], [(s, t)] * 3, samples=0)
    assert [r["mark"] for r in rows] == ["agree", "disagree", "chance"]
    assert [r["chance"] for r in rows] == [False, False, True]


def test_a_zero_side_gets_the_analytic_band():
    """A module whose ref (or dir) is zero has no null to sample: its band is ``Z_CRIT / sqrt(out in)``, and it
    is chance whatever its recorded cosine (here far beyond the band, of either sign)."""
    s = _spectrum([1.0, 0.5])
    rows = [{"shape": [6, 4], "cosine": 0.9, "ref_norm": 0.0, "dir_norm": 1.0, "agree": True},
            {"shape": [6, 4], "cosine": -0.9, "ref_norm": 1.0, "dir_norm": 0.0, "agree": False},
            {"shape": [6, 4], "cosine": 0.9, "ref_norm": 0.0, "dir_norm": 0.0, "agree": True}]
    audit.mark_chance(rows, [(s * 0, s), (s, s * 0), (s * 0, s * 0)], samples=40)
    for r in rows:
        assert r["null_band"] == pytest.approx(audit.Z_CRIT / math.sqrt(24), rel=1e-15)
        assert r["chance"] and r["mark"] == "chance"


@pytest.mark.parametrize("z, significant", [(1.0, 0), (1.5, 0), (1.95, 0), (1.97, 1), (2.5, 1), (-2.5, 0)])
def test_pairwise_significance_is_1_96_null_sd_not_1(z, significant):
    """Issue 23: the pairwise audit's "significant" must be |cos_m| >= 1.96 null sd (two-sided 5%) with
    <a_m, b_m> > 0; a threshold of 1 sd (or 1.645, or 2) would let this test fail. One 10 x 10 module, so
    null sd = 1/sqrt(100) = 0.1, and two rank-1 updates with cosine exactly z x 0.1."""
    from vecmerge.workspace.taskvector import TaskVector

    c = z * 0.1
    e = torch.eye(10, dtype=torch.float64)
    v = e[:1]  # (1, in): the shared right factor
    u_a = e[:, :1]
    u_b = (c * e[:, 0] + math.sqrt(1 - c * c) * e[:, 1]).reshape(10, 1)
    a = TaskVector({"m": LowRank(u_a, v, 1.0)}, {})
    b = TaskVector({"m": LowRank(u_b, v, 1.0)}, {})
    p = audit.pairwise([a, b], ["a", "b"], ["m"])
    assert p["cosine"][0][1] == pytest.approx(c, rel=1e-12)
    assert p["agree"][0][1] == int(z > 0) and p["significant"][0][1] == significant
    assert p["pairs"][0]["significant"] == significant
