"""The evidence commands through the CLI: add, import, export, show (--plot), compare, calibrate and ls.

Figures printed by ``compare`` are checked against scipy (Welch: ``scipy.stats.ttest_ind(equal_var=False)``,
rel 1e-10); summaries against numpy (rel 1e-12). Stale records: the adapter's weights are rewritten and
the records of the old weights leave every statistic. Malformed files: one ``error:`` line naming the
row, exit 2, and the ledger untouched.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import numpy as np
import pytest
from safetensors.torch import load_file, save_file
from scipy import stats

from vecmerge.evidence.ledger.ledger import Ledger

FIX = Path(__file__).parents[1] / "fixtures" / "lm_eval"
V51 = [1.0180, 0.9895, 1.0004, 1.0105, 1.0142]
V28 = [0.9836, 0.9890]
WORKSPACE = """adapters:
  v28: {path: v28, parent: null}
  v51: {path: v51, parent: v28}
  v54e2: {path: v54e2, parent: null}
  v54: {path: v54, parent: v54e2}
metric: official_total
"""


@pytest.fixture
def ws(toy):
    (toy / "vecmerge.yaml").write_text(WORKSPACE)
    return toy


def ok(res, code: int = 0):
    assert res.exit_code == code, res.output
    return res


def one_error_line(res, code: int = 2) -> str:
    assert res.exit_code == code, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    assert "Traceback" not in res.output
    return lines[0]


def record_count(folder) -> int:
    db = folder / "vecmerge-evidence.db"
    return 0 if not db.exists() else sqlite3.connect(db).execute("SELECT COUNT(*) FROM records").fetchone()[0]


def test_add_ties_runs_to_the_content_sha256(ws, run_cli):
    from vecmerge.peft.adapter import Adapter

    out = json.loads(ok(run_cli("evidence", "add", "v51", *V51, "--higher-is-better", "--json")).stdout)
    assert out["metric"] == "official_total" and out["direction"] is True  # metric: from vecmerge.yaml
    assert out["sha256"] == Adapter(ws / "v51").content_sha256 and out["ids"] == [1, 2, 3, 4, 5]
    res = ok(run_cli("evidence", "add", "v59", "0.9944", "--sub", "item=0.2453", "--note", "one run", "--external"))
    assert "no sha256: v59 is an external model (not an adapter of this workspace)" in res.stdout
    rec = Ledger(ws / "vecmerge-evidence.db").records(["v59"])[0]
    assert (rec.sha256, rec.sub_scores, rec.note) == (None, {"item": 0.2453}, "one run")
    ok(run_cli("evidence", "add", "v28", "--metric", "delta", "--", "-0.5"))  # negative values: after --
    ok(run_cli("evidence", "add", "v28", "-0.25", "--metric", "delta"))  # or as they are
    assert [r.value for r in Ledger(ws / "vecmerge-evidence.db").records(["v28"], "delta")] == [-0.5, -0.25]


@pytest.mark.parametrize("args, match", [
    (["evidence", "add", "v51", "1.0", "--sub", "item"], "--sub 'item': give KEY=VALUE"),
    (["evidence", "add", "v51", "1.0", "2.0", "--sub", "a=1"], "--sub a has 1 value(s) for 2 run(s)"),
    (["evidence", "add", "v51", "nan"], "not finite"),
    (["evidence", "compare", "v51", "v5l"], "no records of v5l"),
    (["evidence", "show", "--metric", "acc"], "metric 'acc': no records"),
    (["evidence", "calibrate", "--proxy", "p", "--target", "official_total", "--min-models", "2"], "at least 3"),
    (["evidence", "calibrate", "--proxy", "official_total", "--target", "official_total"], "both official_total"),
])
def test_bad_input_is_one_error_line(ws, run_cli, args, match):
    ok(run_cli("evidence", "add", "v51", *V51))
    before = record_count(ws)
    line = one_error_line(run_cli(*args))
    assert match in line
    assert record_count(ws) == before


def test_add_without_a_metric_needs_one(toy, run_cli):
    assert "--metric M" in one_error_line(run_cli("evidence", "add", "v51", "1.0"))
    assert not (toy / "vecmerge-evidence.db").exists()


def test_show_and_compare_match_numpy_and_scipy(ws, run_cli):
    ok(run_cli("evidence", "add", "v51", *V51, "--higher-is-better"))
    ok(run_cli("evidence", "add", "v28", *V28))
    shown = json.loads(ok(run_cli("evidence", "show", "--json")).stdout)
    s51 = next(s for s in shown["summaries"] if s["model"] == "v51")
    assert s51["mean"] == pytest.approx(np.mean(V51), rel=1e-12)
    assert s51["std"] == pytest.approx(np.std(V51, ddof=1), rel=1e-12)
    lo, hi = stats.t.interval(0.95, 4, loc=np.mean(V51), scale=stats.sem(V51))
    assert (s51["ci_low"], s51["ci_high"]) == pytest.approx((lo, hi), rel=1e-12)
    text = ok(run_cli("evidence", "show", "v51")).stdout
    assert "v51" in text and "1.0065" in text and "v28" not in text
    cmp = json.loads(ok(run_cli("evidence", "compare", "v51", "v28", "--json")).stdout)
    ref = stats.ttest_ind(V51, V28, equal_var=False)
    assert cmp["welch"]["t"] == pytest.approx(ref.statistic, rel=1e-10)
    assert cmp["welch"]["p"] == pytest.approx(ref.pvalue, rel=1e-10)
    assert cmp["verdict"] == "v51 is better beyond eval noise" and cmp["metric"] == "official_total"
    text = ok(run_cli("evidence", "compare", "v51", "v28")).stdout
    assert "verdict: v51 is better beyond eval noise (by the welch test)" in text and "pooled within-model" in text


def test_sub_scores_per_run_through_the_cli_and_compare_keyed_by_name(ws, run_cli):
    """`--sub KEY=V1,V2,...` gives each run its value; compare reports each sub-score with scipy's Welch figures."""
    video51, video28 = [0.3112, 0.2894, 0.3307, 0.3021, 0.3188], [0.2716, 0.2803]
    ok(run_cli("evidence", "add", "v51", *V51, "--higher-is-better", "--sub", "item_understanding=" + ",".join(
        ["0.2453"] * 5), "--sub", "video=" + ",".join(map(str, video51))))
    ok(run_cli("evidence", "add", "v28", *V28, "--sub", "item_understanding=0.2453,0.2453", "--sub",
               "video=" + ",".join(map(str, video28))))
    cmp = json.loads(ok(run_cli("evidence", "compare", "v51", "v28", "--json")).stdout)
    subs = cmp["subscores"]["subscores"]
    assert set(subs) == {"item_understanding", "video"}
    ref = stats.ttest_ind(video51, video28, equal_var=False)
    assert subs["video"]["test"]["kind"] == "welch" and subs["video"]["p"] == pytest.approx(ref.pvalue, rel=1e-10)
    assert subs["video"]["a_summary"]["n"] == 5 and subs["video"]["b_summary"]["mean"] == pytest.approx(
        np.mean(video28), rel=1e-12)
    assert subs["item_understanding"]["kind"] == "exact" and subs["item_understanding"]["status"] == "not_worse"
    text = ok(run_cli("evidence", "compare", "v51", "v28", "--target", "video")).stdout
    assert "sub-scores of official_total (v51 - v28; Holm across the 0 tested" in text
    assert "what it costs the others of raising video: worse beyond noise: none; shown not worse: " \
           "item_understanding; unknown: none" in text
    assert "--sub video given twice" in one_error_line(run_cli("evidence", "add", "v51", "1", "--sub", "video=1",
                                                               "--sub", "video=2"))
    assert "--margin -1.0" in one_error_line(run_cli("evidence", "compare", "v51", "v28", "--margin", "-1"))


def test_plan_and_decide_through_the_cli(ws, run_cli):
    ok(run_cli("evidence", "add", "v28", "0.97", "--higher-is-better"))
    out = json.loads(ok(run_cli("evidence", "plan", "v51", "--vs", "v28", "--min-effect", "0.01", "--max-runs", "8",
                                "--json")).stdout)
    plan = out["plan"]
    assert plan["metric"] == "official_total" and plan["a_sha256"] and plan["b_sha256"]
    assert plan["test"] == "group-sequential" and plan["chain"] and out["power"]["power_d"] is None
    assert out["looks_from"] == 2 and plan["prior_scale"] == 1.0  # one run recorded: no noise estimate yet
    text = ok(run_cli("evidence", "plan", "v51", "--vs", "v28", "--min-effect", "0.02", "--max-runs", "8",
                      "--kind", "anytime")).stdout
    assert text.startswith("plan 2 recorded: is v51 better than v28 on official_total (higher is better)")
    assert "anytime-valid t-mixture" in text and "warning: the plan's power is not simulated without" in text
    for i in range(5):
        ok(run_cli("evidence", "add", "v51", str(1.03 + 0.001 * i)))
        ok(run_cli("evidence", "add", "v28", str(0.98 - 0.002 * i)))
    res = json.loads(ok(run_cli("evidence", "decide", "v51", "--vs", "v28", "--replay", "--json")).stdout)
    assert res["plan"]["id"] == 2 and res["plan"]["test"] == "t-mixture"
    assert res["decision"] == "stop_better" and [x["n_b"] for x in res["looks"]][:2] == [2, 2]
    text = ok(run_cli("evidence", "decide", "v51", "--vs", "v28", "--replay")).stdout
    assert "decision: stop_better (the sequence's lower end" in text and "confidence sequence" in text
    assert "--max-runs 1: at least 2" in one_error_line(run_cli("evidence", "plan", "v51", "--vs", "v28",
                                                                "--min-effect", "0.01", "--max-runs", "1"))
    assert "--min-effect 0.0" in one_error_line(run_cli("evidence", "plan", "v51", "--vs", "v28", "--min-effect", "0",
                                                        "--max-runs", "5"))
    assert "no plan of v28 --vs v51" in one_error_line(run_cli("evidence", "decide", "v28", "--vs", "v51"))


def test_show_names_the_grid_of_the_published_grades(tmp_path, monkeypatch, run_cli):
    import shutil
    from pathlib import Path

    shutil.copy(Path(__file__).resolve().parents[2] / "examples" / "evidence" / "grades.csv", tmp_path)
    monkeypatch.chdir(tmp_path)
    ok(run_cli("evidence", "import", "grades.csv", "--higher-is-better", "item_understanding"))
    text = ok(run_cli("evidence", "show")).stdout
    assert "grid: item_understanding moves in grades of 0.030663 (6 values seen at grades 0, 1, 2, 3, 4, 5; " \
           "multiples of the step)" in text
    cmp = ok(run_cli("evidence", "compare", "v37", "v51")).stdout
    assert "verdict: not enough runs" in cmp  # one run of v37: no test, but the grades say how far apart
    assert "grid: item_understanding moves in grades of 0.030663; the difference of means, -0.0613, is -2.00 " \
           "grades" in cmp
    cmp = json.loads(ok(run_cli("evidence", "compare", "v58", "v51", "--json")).stdout)
    assert cmp["grid"]["step"] == pytest.approx(0.030663, abs=1e-6)
    assert "is +0.00 grades (below one grade)" in ok(run_cli("evidence", "compare", "v58", "v51")).stdout


def test_stale_records_leave_every_statistic_after_the_adapter_changes(ws, run_cli):
    ok(run_cli("evidence", "add", "v51", "0.90", "0.91", "--higher-is-better"))  # the first v51 weights
    ok(run_cli("evidence", "add", "v28", *V28))
    weights = ws / "v51" / "adapter_model.safetensors"
    sd = load_file(weights)
    save_file({k: v * 1.5 if "lora_B" in k else v for k, v in sd.items()}, weights)  # v51 retrained
    ok(run_cli("evidence", "add", "v51", *V51))
    shown = json.loads(ok(run_cli("evidence", "show", "v51", "--json")).stdout)
    assert shown["summaries"][0]["n"] == 5 and shown["summaries"][0]["mean"] == pytest.approx(np.mean(V51), rel=1e-12)
    assert shown["stale"][0]["records"] == 2
    assert "stale: 2 record(s) of v51" in ok(run_cli("evidence", "show", "v51")).stdout
    with_stale = json.loads(ok(run_cli("evidence", "show", "v51", "--stale", "--json")).stdout)
    assert with_stale["summaries"][0]["n"] == 7
    cmp = json.loads(ok(run_cli("evidence", "compare", "v51", "v28", "--json")).stdout)
    assert cmp["welch"]["n"] == [5, 2]
    assert cmp["welch"]["p"] == pytest.approx(stats.ttest_ind(V51, V28, equal_var=False).pvalue, rel=1e-10)
    rows = {r["name"]: r for r in json.loads(ok(run_cli("ls", "--json")).stdout)["adapters"]}
    assert (rows["v51"]["runs"], rows["v51"]["stale"]) == (5, 2)
    exported = json.loads(ok(run_cli("evidence", "export", "--json")).stdout)["records"]
    assert sum(r["stale"] for r in exported) == 2 and len(exported) == 9
    (ws / "v51" / "adapter_config.json").unlink()  # unreadable now: nothing of it counts as current
    shown = json.loads(ok(run_cli("evidence", "show", "v51", "--json")).stdout)
    assert shown["summaries"] == [] and shown["stale"][0]["records"] == 7


MALFORMED = [
    ("bad.csv", "model,metric,value\nv51,official_total,1.0\nv51,official_total,abc\n",
     "bad.csv: line 3, field 'value': 'abc' is not a number"),
    ("bad.csv", "model,metric,value,sub.item\nv51,official_total,1.0,\nv28,official_total,0.9,x\n",
     "bad.csv: line 3, field 'sub.item': 'x' is not a number"),
    ("results.json", json.dumps({"model_name": "v51", "results": {"toy": {"acc,none": "oops"}}}),
     "results.json: results.toy, field 'acc,none': 'oops' is not a number"),
    ("broken.json", '{"results": {\n"t": {"acc,none": 1.0,}}}', "broken.json: line 2: not valid JSON"),
]


@pytest.mark.parametrize("name, text, match", MALFORMED)
def test_a_malformed_file_is_one_error_line_naming_the_row_and_writes_nothing(ws, run_cli, name, text, match):
    good = ws / "good.csv"
    good.write_text("model,metric,value\nv51,official_total,1.0\n")
    (ws / name).write_text(text)
    line = one_error_line(run_cli("evidence", "import", "good.csv", name))  # the good file is not written either
    assert match in line and line.endswith("nothing was recorded")
    assert not (ws / "vecmerge-evidence.db").exists()
    ok(run_cli("evidence", "add", "v28", *V28))
    one_error_line(run_cli("evidence", "import", "good.csv", name))
    assert record_count(ws) == 2


def test_import_export_round_trip_and_directions(ws, run_cli):
    (ws / "runs.csv").write_text("model,metric,value,note\n" + "".join(f"v51,official_total,{v},r\n" for v in V51)
                                 + "v60,official_total,0.9895,published\n")
    res = ok(run_cli("evidence", "import", "runs.csv", "--higher-is-better", "official_total"))
    assert "imported 6 records from runs.csv" in res.stdout and "without a sha256" in res.stdout
    assert Ledger(ws / "vecmerge-evidence.db").directions() == {"official_total": True}
    csv_text = ok(run_cli("evidence", "export")).stdout
    (ws / "again.csv").write_text(csv_text)
    ok(run_cli("--workspace", "vecmerge.yaml", "evidence", "import", "again.csv"))
    assert record_count(ws) == 12
    line = one_error_line(run_cli("evidence", "import", "runs.csv", "--lower-is-better", "official_total"))
    assert "already says higher is better" in line and record_count(ws) == 12



def test_import_json_states_what_was_imported(ws, run_cli):
    """Issue 13 item 5j: ``import --json`` prints one JSON document (stdout only) naming the files, the record count and
    the ids written (those in the ledger), the models, metrics, item-level rows, declared directions and the names
    that are no adapter here (recorded without a sha256)."""
    ok(run_cli("evidence", "add", "v28", *V28))  # ids 1, 2
    (ws / "runs.csv").write_text("model,metric,value,item\n" + "".join(f"v51,official_total,{v},\n" for v in V51)
                                 + "v51,item_acc,1.0,q1\nv51,item_acc,0.0,q2\nv60,official_total,0.9895,\n")
    res = ok(run_cli("evidence", "import", "runs.csv", "--higher-is-better", "official_total", "--json"))
    assert res.stderr == ""
    out = json.loads(res.stdout)
    assert out == {"files": ["runs.csv"], "records": 8, "ids": [3, 10], "models": ["v51", "v60"],
                   "metrics": ["item_acc", "official_total"], "item_level": 2, "directions": {"official_total": True},
                   "unhashed": ["v60"], "environments": {}, "duplicates": []}
    ledger = Ledger(ws / "vecmerge-evidence.db")
    recs = ledger.records(["v51", "v60"], "official_total") + ledger.records(["v51"], "item_acc")
    assert sorted(r.id for r in recs) == list(range(3, 11)) and record_count(ws) == 10

def test_show_plot_is_a_png_and_never_overwrites_an_input(ws, run_cli):
    """--plot: a PNG, written atomically; refused over the ledger, the workspace file and inside an adapter even
    with --force; over an existing file only with --force and only if it is a PNG."""
    ok(run_cli("evidence", "add", "v51", *V51))
    ok(run_cli("evidence", "add", "v59", "0.9944", "--external"))
    res = ok(run_cli("evidence", "show", "--plot", "scores.png"))
    assert (ws / "scores.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and "plot: scores.png" in res.stdout
    assert not list(ws.glob(".scores.png.*"))
    ledger_bytes = (ws / "vecmerge-evidence.db").read_bytes()
    for target in ("vecmerge-evidence.db", "vecmerge.yaml", "v51/adapter_model.safetensors", "v51/plot.png"):
        before = (ws / target).read_bytes() if (ws / target).exists() else None
        line = one_error_line(run_cli("evidence", "show", "--plot", target, "--force"))
        assert "which vecmerge never writes" in line or "inside the adapter folder" in line, line
        assert ((ws / target).read_bytes() if (ws / target).exists() else None) == before
    assert (ws / "vecmerge-evidence.db").read_bytes() == ledger_bytes
    first = (ws / "scores.png").read_bytes()
    assert "already exists; pass --force" in one_error_line(run_cli("evidence", "show", "--plot", "scores.png"))
    ok(run_cli("evidence", "add", "v59", "0.9950"))
    ok(run_cli("evidence", "show", "--plot", "scores.png", "--force"))  # a PNG of ours: replaced whole
    assert (ws / "scores.png").read_bytes() != first and not [p for p in ws.iterdir() if p.name.startswith(".")]
    (ws / "notes.txt").write_text("mine")
    assert "is not a PNG" in one_error_line(run_cli("evidence", "show", "--plot", "notes.txt", "--force"))


def _calibration_csv(path, models: int, seed: int = 3) -> None:
    """``models`` past models: 3 target runs each; a proxy that tracks the target, and one that is noise."""
    rng = np.random.default_rng(seed)
    true = np.linspace(0.90, 1.02, models)
    rows = ["model,metric,value"]
    for i, t in enumerate(true):
        rows += [f"m{i},official_total,{float(t + rng.normal(0, 0.004))!r}" for _ in range(3)]
        rows.append(f"m{i},tracking,{float(t + rng.normal(0, 0.01))!r}")
        rows.append(f"m{i},noise,{float(rng.normal(0, 1))!r}")
    path.write_text("\n".join(rows) + "\n")


@pytest.mark.parametrize("models, proxy, verdict", [
    (10, "tracking", "ranks candidates"),
    (10, "noise", "disaster detector only"),
    (5, "tracking", "too few models"),
])
def test_calibration_verdicts(ws, run_cli, models, proxy, verdict):
    _calibration_csv(ws / "past.csv", models)
    ok(run_cli("evidence", "import", "past.csv", "--higher-is-better", "official_total",
               "--higher-is-better", proxy))
    out = json.loads(ok(run_cli("evidence", "calibrate", "--proxy", proxy, "--target", "official_total",
                                "--json")).stdout)
    assert out["verdict"] == verdict and len(out["models"]) == models
    means = {m: np.mean([r.value for r in Ledger(ws / "vecmerge-evidence.db").records([m], k)])
             for m in out["models"] for k in ("official_total",)}
    prox = {m: Ledger(ws / "vecmerge-evidence.db").records([m], proxy)[0].value for m in out["models"]}
    rho = stats.spearmanr([prox[m] for m in out["models"]], [means[m] for m in out["models"]])[0]
    assert out["spearman"] == pytest.approx(rho, rel=1e-12)
    text = ok(run_cli("evidence", "calibrate", "--proxy", proxy, "--target", "official_total")).stdout
    assert f"verdict: {verdict}" in text


def test_ls_lists_lineage_hashes_and_runs(ws, run_cli):
    from vecmerge.peft.adapter import Adapter

    ok(run_cli("evidence", "add", "v51", *V51))
    ok(run_cli("project", "--base", "v54", "--dir", "v51-v28", "--trust", "0.01", "--out", "v58"))
    (ws / "v60").mkdir()  # listed, but holds no adapter
    (ws / "vecmerge.yaml").write_text(WORKSPACE.replace("metric:", "  v58: v58\n  v60: v60\nmetric:"))
    out = json.loads(ok(run_cli("ls", "--json")).stdout)
    rows = {r["name"]: r for r in out["adapters"]}
    assert rows["v51"]["sha256"] == Adapter(ws / "v51").content_sha256 and rows["v51"]["parent"] == "v28"
    assert rows["v51"]["runs"] == 5 and rows["v51"]["mean"] == pytest.approx(np.mean(V51), rel=1e-12)
    assert rows["v58"]["parent"] == "v54"  # from its manifest
    assert rows["v28"]["root"] and rows["v28"]["parent"] is None
    assert rows["v60"]["sha256"] is None and rows["v60"]["problem"] == "unreadable"
    assert rows["v54"]["base_model"] == json.loads((ws / "v54" / "adapter_config.json").read_text())[
        "base_model_name_or_path"]
    text = ok(run_cli("ls")).stdout
    assert "(root)" in text and "(unreadable)" in text and Adapter(ws / "v51").content_sha256[:12] in text


@pytest.mark.parametrize("block, count", [("evidence-example", 3), ("evidence-plan-example", 4)])
def test_the_guide_evidence_example_is_what_the_cli_prints(tmp_path, monkeypatch, run_cli, block, count):
    """docs/GUIDE.md pastes `import`, `show` and `compare v51 v28` on the user's scores, and a plan with its decision
    over them (tools/update_docs.py); run them and compare."""
    import shlex
    import shutil
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    pasted = (root / "docs" / "GUIDE.md").read_text().split(f"<!-- {block}:start -->")[1].split(
        f"<!-- {block}:end -->")[0].split("```text\n", 1)[1].rsplit("```", 1)[0]
    for csv in (root / "examples" / "evidence").glob("*.csv"):
        shutil.copy(csv, tmp_path / csv.name)
    monkeypatch.chdir(tmp_path)
    chunks = pasted.split("$ vecmerge ")[1:]
    assert len(chunks) == count
    for chunk in chunks:
        command, expected = chunk.split("\n", 1)
        res = ok(run_cli(*shlex.split(command)))
        assert res.stdout.rstrip() == expected.rstrip(), command


# -- issue 23: names, stale records, cycles -----------------------------------------------------------------------
def test_a_near_miss_of_a_workspace_name_is_refused_and_an_unrelated_name_is_external(ws, run_cli):
    line = one_error_line(run_cli("evidence", "add", "v5l", "1.01"))
    assert "v5l is not an adapter of this workspace: did you mean v51?" in line and "--external" in line
    assert record_count(ws) == 0
    res = ok(run_cli("evidence", "add", "v99", "1.01"))
    assert "v99 is an external model (not an adapter of this workspace)" in res.stdout
    assert json.loads(ok(run_cli("evidence", "add", "v99", "1.02", "--json")).stdout)["external"] is True
    ok(run_cli("evidence", "add", "v5l", "1.01", "--external"))  # said on purpose
    ok(run_cli("evidence", "add", "v5l", "1.02"))  # now a model of the ledger: no question asked again
    assert json.loads(ok(run_cli("evidence", "add", "v51", "1.0", "--json")).stdout)["external"] is False


def test_a_stale_record_says_it_is_stale(ws, run_cli):
    ok(run_cli("evidence", "add", "v51", *V51, "--higher-is-better"))
    ok(run_cli("evidence", "add", "v28", *V28))
    tensors = load_file(ws / "v51" / "adapter_model.safetensors")
    save_file({k: v * 1.01 for k, v in tensors.items()}, ws / "v51" / "adapter_model.safetensors")  # retrained
    text = ok(run_cli("evidence", "compare", "v51", "v28", "--metric", "official_total")).stdout
    assert "note: v51: its 5 record(s) on official_total are stale (they measured other weights" in text
    line = one_error_line(run_cli("evidence", "compare", "v51", "v28"))  # which metric: none current is shared
    assert "the records of v51 are stale: they measured other weights" in line and "share no metric" not in line
    tensors = load_file(ws / "v28" / "adapter_model.safetensors")
    save_file({k: v * 1.01 for k, v in tensors.items()}, ws / "v28" / "adapter_model.safetensors")
    line = one_error_line(run_cli("evidence", "compare", "v51", "v28", "--metric", "official_total"))
    assert "every record of v51 and v28 on official_total is stale" in line and "--stale" in line
    out = json.loads(ok(run_cli("evidence", "compare", "v51", "v28", "--metric", "official_total", "--stale",
                                "--json")).stdout)
    assert out["a_summary"]["n"] == 5


def test_ls_refuses_a_cycle_of_parents_naming_it(ws, run_cli):
    (ws / "vecmerge.yaml").write_text(WORKSPACE.replace("v28: {path: v28, parent: null}",
                                                        "v28: {path: v28, parent: v51}"))
    line = one_error_line(run_cli("ls"))
    assert "lineage cycle: v28 -> v51 -> v28" in line


# -- issue 28: environments and replicates through the CLI ---------------------------------------------------------
def test_add_and_import_say_the_environment(ws, run_cli):
    res = ok(run_cli("evidence", "add", "v51", "0.463", "--env", "timeout=180", "--env", "harness=tb2"))
    assert res.stdout.splitlines()[1].endswith(": harness=tb2, timeout=180")
    assert "--env 'timeout': give KEY=VALUE" in one_error_line(run_cli("evidence", "add", "v51", "1", "--env",
                                                                       "timeout"))
    res = ok(run_cli("evidence", "import", str(FIX / "v51_results.json")))
    assert res.stdout.count("eval environment ") == 2 and "harness=lm-eval, harness_version=0.4.13" in res.stdout


def test_replicates_report_variance_components_in_show_and_compare(ws, run_cli):
    """v51b is another training of v51's configuration (a copy of its folder stands in for it here)."""
    import shutil

    shutil.copytree(ws / "v51", ws / "v51b")
    (ws / "vecmerge.yaml").write_text(WORKSPACE.replace("metric:", "  v51b: {path: v51b, replicate_of: v51}\nmetric:"))
    ok(run_cli("evidence", "add", "v51", "1.00", "1.01", "1.02", "--higher-is-better"))
    ok(run_cli("evidence", "add", "v51b", "0.96", "0.97", "0.98"))
    ok(run_cli("evidence", "add", "v28", "0.95", "0.951", "0.952"))
    shown = json.loads(ok(run_cli("evidence", "show", "--json")).stdout)
    (comp,) = shown["replicates"]
    # by hand: means 1.01 and 0.97, grand mean 0.99; SSB = 3 (0.02² + 0.02²) = 0.0024 on 1 df; SSW = 2 x 0.0002 =
    # 0.0004 on 4 df, MSW = 0.0001; n0 = 3; σ̂²_b = (0.0024 - 0.0001) / 3
    assert comp["members"] == ["v51", "v51b"] and comp["var_within_eval"] == pytest.approx(0.0001, rel=1e-9)
    assert comp["var_between_training"] == pytest.approx(0.0023 / 3, rel=1e-9)
    text = ok(run_cli("evidence", "show")).stdout
    assert "replicates of v51 on official_total: 2 trainings (v51, v51b), 6 runs; between trainings var 0.0007667" \
           in text
    out = json.loads(ok(run_cli("evidence", "compare", "v51", "v28", "--json")).stdout)
    (group,) = out["replicates"]["groups"]
    assert {"var_between_training", "var_within_eval"} <= set(group)
    assert out["replicates"]["test"]["n"] == [2, 1] and out["verdict_code"] == "a_better"
    assert any("over trainings (training plus evaluation noise) the difference is within noise" in r
               for r in out["reasons"])
    text = ok(run_cli("evidence", "compare", "v51", "v28")).stdout
    assert "over trainings (2 of v51: v51, v51b; 1 of v28: v28; training plus evaluation noise" in text


def test_plan_max_runs_past_sqlite_integers_is_one_line_exit_2(ws, run_cli):
    """Issue 36 item 10: ``--max-runs 99999999999999999999`` was an SQLite OverflowError (exit 3); now bounded."""
    from vecmerge.evidence.ledger.records import MAX_PLAN_RUNS

    ok(run_cli("evidence", "add", "v28", "0.97", "--higher-is-better"))
    for n in ("99999999999999999999", str(MAX_PLAN_RUNS + 1)):
        line = one_error_line(run_cli("evidence", "plan", "v51", "--vs", "v28", "--min-effect", "0.01",
                                      "--max-runs", n))
        assert n in line and f"at most {MAX_PLAN_RUNS}" in line and "max" in line
    assert Ledger(ws / "vecmerge-evidence.db").plans() == []
    ok(run_cli("evidence", "plan", "v51", "--vs", "v28", "--min-effect", "0.01", "--max-runs", str(MAX_PLAN_RUNS)))


def test_export_is_written_in_pieces_with_the_same_text(ws, run_cli, monkeypatch):
    """``evidence export`` streams (issue 36 item 10): written in pieces of ``CHUNK`` characters, the output is the
    text written at once, for CSV and JSON."""
    import vecmerge.commands.recording as command

    for i in range(30):
        ok(run_cli("evidence", "add", "v51", str(1 + i / 100), "--sub", f"video={i / 10}"))
    for args in ((), ("--json",)):
        whole = ok(run_cli("evidence", "export", *args)).stdout
        monkeypatch.setattr(command, "CHUNK", 64)
        assert ok(run_cli("evidence", "export", *args)).stdout == whole
        monkeypatch.undo()
    assert whole.endswith("}\n") and not whole.endswith("\n\n")


def test_show_with_a_name_shows_its_replicate_group(ws, run_cli):
    """Issue 36 item 12: ``evidence show v51`` shows v51's replicate group (v51b's runs included), not only
    without a name; a name outside any group shows none."""
    import shutil

    shutil.copytree(ws / "v51", ws / "v51b")
    (ws / "vecmerge.yaml").write_text(WORKSPACE.replace("metric:", "  v51b: {path: v51b, replicate_of: v51}\nmetric:"))
    ok(run_cli("evidence", "add", "v51", "1.00", "1.01", "1.02", "--higher-is-better"))
    ok(run_cli("evidence", "add", "v51b", "0.96", "0.97", "0.98"))
    ok(run_cli("evidence", "add", "v28", "0.95", "0.951", "0.952"))
    for name in ("v51", "v51b"):
        shown = json.loads(ok(run_cli("evidence", "show", name, "--json")).stdout)
        (comp,) = shown["replicates"]
        assert comp["members"] == ["v51", "v51b"] and comp["var_within_eval"] == pytest.approx(0.0001, rel=1e-9)
        assert comp["var_between_training"] == pytest.approx(0.0023 / 3, rel=1e-9)  # by hand, as above
        assert {s["model"] for s in shown["summaries"]} == {name}  # the summaries stay the named model's
    assert "replicates of v51 on official_total: 2 trainings" in ok(run_cli("evidence", "show", "v51")).stdout
    assert json.loads(ok(run_cli("evidence", "show", "v28", "--json")).stdout)["replicates"] == []


def test_group_compare_facts_acc_pairs_items_from_an_imported_tree(ws, run_cli, tmp_path):
    """Issue 33 item 3's finding: `compare v54 v60 --metric facts/acc` said "no item-level records for both";
    a folder imports in one command, lm-eval's stderr shows beside vecmerge's SE, a second import adds nothing."""
    from lm_eval_layout import scores, write_run

    out = tmp_path / "out"
    write_run(out, "v54", "2026-12-01T10-00-00.000001", scores(5, 0.8))
    write_run(out / "x", "v60", "2026-12-01T11-00-00.000001", scores(6, 0.6))
    first = ok(run_cli("evidence", "import", str(out))).stdout
    assert "imported " in first and "not counted twice" not in first
    again = ok(run_cli("evidence", "import", str(out))).stdout
    assert again.startswith("imported 0 records") and again.count("not counted twice: ") == 8
    text = ok(run_cli("evidence", "compare", "v54", "v60", "--metric", "facts/acc")).stdout
    assert "no item-level records" not in text and "paired (McNemar" in text and "harness SE (items)" in text
    res = json.loads(ok(run_cli("evidence", "compare", "v54", "v60", "--metric", "facts/acc", "--json")).stdout)
    assert res["paired"]["n"] == [120] and res["decided_by"] == "paired"


# -- issue 33: plans a user can act on ----------------------------------------------------------------------------
def test_plan_states_its_power_and_warns_before_a_run_is_spent(ws, run_cli):
    """A 5-run plan at D 0.01, sd 0.012, the direction given on the plan, v28's and v51's runs counted."""
    ok(run_cli("evidence", "add", "v28", "0.9836", "0.9890", "0.9870"))
    ok(run_cli("evidence", "add", "v51", "1.0180", "0.9895"))
    text = ok(run_cli("evidence", "plan", "v51", "--vs", "v28", "--min-effect", "0.01", "--max-runs", "5",
                      "--higher-is-better", "--noise-sd", "0.012", "--use-existing")).stdout
    assert "planned looks (group-sequential Welch, obf alpha spending, a look every 1 run(s), futility beta 0.1)" \
        in text
    assert "power (stop_better) 1" in text and "at D = 0.01" in text and "a fixed-n t test needs" in text
    assert "warning: power 1" in text and "runs of each reach 80%" in text
    assert "its looks: the 2 + 3 runs recorded before it (the first look)" in text
    ok(run_cli("evidence", "add", "v51", "1.0004", "1.0105", "1.0142"))
    ok(run_cli("evidence", "add", "v28", "0.9850", "0.9880"))
    out = json.loads(ok(run_cli("evidence", "decide", "v51", "--vs", "v28", "--replay", "--json")).stdout)
    assert out["decision"] == "stop_better" and out["runs"] == [5, 4]  # v51 leads v28 by about 0.02
    assert out["looks"][0]["n_a"] == 2 and out["looks"][0]["n_b"] == 3 and out["power"]["power_d"] < 0.5
    text = ok(run_cli("evidence", "decide", "v51", "--vs", "v28", "--replay")).stdout
    assert "stop at t" in text and "futile if diff <=" in text and "decision: stop_better (t " in text
    assert "--beta 1.0: in [0, 1)" in one_error_line(run_cli("evidence", "plan", "v51", "--vs", "v28", "--min-effect",
                                                              "0.01", "--max-runs", "5", "--beta", "1"))
    assert "--max-runs 99999999999999999999" in one_error_line(run_cli(
        "evidence", "plan", "v51", "--vs", "v28", "--min-effect", "0.01", "--max-runs", "99999999999999999999"))
