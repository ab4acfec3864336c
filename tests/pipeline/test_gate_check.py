"""``vecmerge gate`` and ``project --gate`` on constructed workspaces: each condition flips PASS <-> FAIL/UNKNOWN.

The workspace is the toy trajectory (v28 -> v51, v54e2 -> v54, all agreeing in sign) with the user's
published v51/v28 runs and three constructed v54 runs; every test changes one thing and reads the row.
The gate's consensus and trust are the pipeline's own: they equal ``vecmerge audit``'s count and the
manifest's realized step exactly.
"""

from __future__ import annotations

import json
import math

import pytest

from vecmerge.evidence.ledger.ledger import Ledger
from vecmerge.testing import llm_shapes, toy_adapter, toy_trajectory
from vecmerge.workspace.names import Workspace

V51 = [1.0180, 0.9895, 1.0004, 1.0105, 1.0142]
V28 = [0.9836, 0.9890]
V54 = [0.9940, 0.9950, 0.9946]  # constructed: the user published only their mean
M = "official_total"
PARENTS = {"v28": "null", "v51": "v28", "v54e2": "null", "v54": "v54e2"}
GATE = ["gate", "--base", "v54", "--dir", "v51-v28", "--consensus-ref", "v54-v54e2", "--trust", "0.0113"]
PROJECT = ["project", "--base", "v54", "--dir", "v51-v28", "--consensus-ref", "v54-v54e2", "--trust", "0.0113",
           "--gate", "--out", "out/v58"]


def workspace(root, parents=PARENTS, extra: str = "") -> None:
    lines = ["adapters:"] + [f"  {n}: {{path: {n}, parent: {parents[n]}}}" if n in parents else f"  {n}: {n}"
                             for n in ("v28", "v51", "v54e2", "v54")]
    (root / "vecmerge.yaml").write_text("\n".join(lines) + f"\nmetric: {M}\n{extra}")


def record(root, runs: dict) -> None:
    ws = Workspace(root=root)
    ledger = Ledger(ws.ledger_path)
    ledger.set_direction(M, True)
    for name, values in runs.items():
        if values:
            ledger.add(name, ws.content_sha(name), M, values)


RUNS = {"v51": V51, "v28": V28, "v54": V54}


@pytest.fixture
def gate_ws(toy):
    workspace(toy)
    record(toy, RUNS)
    return toy


def rows_of(res) -> dict:
    return {r["condition"]: r for r in json.loads(res.stdout)["rows"]}


def test_the_v58_workspace_passes_all_seven(gate_ws, run_cli):
    res = run_cli(*GATE)
    assert res.exit_code == 0, res.output
    assert "PASSED: all 7 conditions" in res.stdout
    for cond in ("common base", "common parent", "stable backbone", "repeated evidence", "module consensus",
                 "small trust region", "no sub-score regresses"):
        assert cond in res.stdout
    rows = rows_of(run_cli(*GATE, "--json"))
    assert {r["status"] for r in rows.values()} == {"PASS"}
    assert rows["common parent"]["detail"] == "v51 descends from v28 (1 generation)"
    assert rows["small trust region"]["numbers"]["trust"] == pytest.approx(0.0113, rel=1e-12)
    assert rows["small trust region"]["source"] == "default"


def _edit_config(root, name, **changes):
    path = root / name / "adapter_config.json"
    cfg = json.loads(path.read_text())
    cfg.update(changes)
    path.write_text(json.dumps(cfg))


CASES = {  # id: (prepare(root), extra args, condition, status, words in its detail)
    "other base model": (lambda r: _edit_config(r, "v28", base_model_name_or_path="other-base"), [],
                         "common base", "FAIL", "different base models"),
    "no base model declared": (lambda r: _edit_config(r, "v28", base_model_name_or_path=None), [],
                               "common base", "UNKNOWN", "no base model declared by v28"),
    "no lineage": (lambda r: workspace(r, parents={}), [], "common parent", "UNKNOWN", "no recorded lineage"),
    "two roots": (lambda r: workspace(r, parents={**PARENTS, "v51": "null"}), [], "common parent", "FAIL",
                  "unrelated"),
    "common ancestor": (lambda r: workspace(r, parents={**PARENTS, "v51": "v16", "v28": "v16"}), [],
                        "common parent", "PASS", "common ancestor v16"),
    "two backbone runs": (lambda r: None, {"v54": V54[:2]}, "stable backbone", "FAIL", "2 run(s) < 3"),
    "no backbone runs": (lambda r: None, {"v54": []}, "stable backbone", "UNKNOWN", "no runs of v54"),
    "noisy backbone": (lambda r: None, {"v54": [0.95, 1.0, 1.05]}, "stable backbone", "FAIL", "> 0.0"),
    "set backbone limit": (lambda r: workspace(r, extra="gate: {max_backbone_sd: 0.1}\n"),
                           {"v54": [0.95, 1.0, 1.05]}, "stable backbone", "PASS", "<= 0.1"),
    "within noise": (lambda r: None, {"v51": [0.985, 0.988, 0.99]}, "repeated evidence", "FAIL", "within noise"),
    "one run of X": (lambda r: None, {"v51": [1.0180]}, "repeated evidence", "UNKNOWN", "not enough runs"),
    "Y better": (lambda r: None, {"v51": [0.90, 0.901, 0.899]}, "repeated evidence", "FAIL",
                 "v28 is better beyond eval noise"),
    "no consensus reference": (lambda r: None, ["--consensus-ref", None], "module consensus", "UNKNOWN",
                               "no consensus audit"),
    "a disagreeing module": (lambda r: _disagree(r), [], "module consensus", "FAIL", "13/14 modules agree"),
    "a lower min_agree": (lambda r: (_disagree(r), workspace(r, extra="gate: {min_agree: 0.9}\n")), [],
                          "module consensus", "PASS", "13/14 modules agree"),
    "a large step": (lambda r: None, ["--trust", "0.02"], "small trust region", "FAIL", "> 0.015"),
    "no trust": (lambda r: None, ["--trust", None], "small trust region", "UNKNOWN", "no trust"),
    "a set max_trust": (lambda r: workspace(r, extra="gate: {max_trust: 0.03}\n"), ["--trust", "0.02"],
                        "small trust region", "PASS", "<= 0.03"),
}


def _disagree(root):
    toy_trajectory(root, disagree=("model.layers.1.mlp.up_proj",))
    workspace(root)


def _args(extra: list) -> list:
    args = list(GATE)
    for i in range(0, len(extra), 2):
        flag, value = extra[i], extra[i + 1]
        k = args.index(flag) if flag in args else None
        if k is not None:
            del args[k:k + 2]
        if value is not None:
            args += [flag, value]
    return args


@pytest.mark.parametrize("case", list(CASES))
def test_each_condition_flips(toy, run_cli, case):
    prepare, extra, condition, status, words = CASES[case]
    workspace(toy)
    prepare(toy)
    runs = {**RUNS, **extra} if isinstance(extra, dict) else RUNS
    record(toy, runs)
    res = run_cli(*_args(extra if isinstance(extra, list) else []), "--json")
    rows = rows_of(res)
    assert rows[condition]["status"] == status, rows[condition]
    assert words in rows[condition]["detail"], rows[condition]["detail"]
    others = {c: r["status"] for c, r in rows.items() if c != condition}
    assert set(others.values()) == {"PASS"}, others  # one change, one row
    assert res.exit_code == (0 if status == "PASS" else 1)
    if status != "PASS":
        text = run_cli(*_args(extra if isinstance(extra, list) else []))
        assert text.exit_code == 1 and f"{condition} {status}" in text.stderr
        assert text.stderr.count("\n") == 1 and text.stderr.startswith("error: gate:")


def test_threshold_sources_are_stated(gate_ws, run_cli):
    workspace(gate_ws, extra="gate: {max_trust: 0.02, min_repeats: 2}\n")
    rows = rows_of(run_cli(*GATE, "--json"))
    assert rows["small trust region"]["source"].endswith("vecmerge.yaml gate.max_trust")
    assert rows["stable backbone"]["source"].startswith("min_repeats ") and "gate.min_repeats" in \
        rows["stable backbone"]["source"]
    assert rows["repeated evidence"]["source"] == "confidence default; min_evidence_runs default"


def test_shapes_that_differ_fail_the_common_base(gate_ws, run_cli, monkeypatch):
    toy_adapter("v28", shapes=llm_shapes(2, 64, 48, 4, 2, 16))
    rows = rows_of(run_cli(*GATE, "--json"))
    assert rows["common base"]["status"] == "FAIL" and "shapes differ" in rows["common base"]["detail"]
    assert rows["module consensus"]["status"] == "UNKNOWN"  # not computed on mismatched adapters
    assert rows["small trust region"]["numbers"]["trust"] == 0.0113  # the recipe's own, no step to realize


@pytest.mark.parametrize("extra, match", [
    ("gate: {min_repeats: 0, colour: red}\n", "2 problems: colour: unknown key"),
    ("gate: [1, 2]\n", "gate: [1, 2] must be a mapping"),
])
def test_a_bad_gate_section_reports_every_problem(gate_ws, run_cli, extra, match):
    workspace(gate_ws, extra=extra)
    res = run_cli(*GATE)
    assert res.exit_code == 2 and res.stderr.count("\n") == 1 and match in res.stderr, res.output
    if "colour" in extra:
        assert "min_repeats=0" in res.stderr


def test_gate_input_errors(gate_ws, run_cli):
    res = run_cli("gate", "--base", "v54", "--dir", "v51 - 0.5*v28", "--trust", "0.01")
    assert res.exit_code == 2 and "must be X - Y of two adapters" in res.stderr
    res = run_cli("gate", "--base", "v54 + v51", "--dir", "v51-v28")
    assert res.exit_code == 2 and "must be one adapter name" in res.stderr
    res = run_cli(*GATE, "--metric", "acc")
    assert res.exit_code == 2 and "metric 'acc' has no records" in res.stderr
    res = run_cli("gate", "--base", "v54", "--dir", "v51-v28", "--trust", "-1")
    assert res.exit_code == 2 and "--trust -1.0" in res.stderr
    workspace(gate_ws, parents={**PARENTS, "v28": "v51"})
    res = run_cli(*GATE)
    assert res.exit_code == 2 and "lineage cycle: v51 -> v28 -> v51" in res.stderr


def test_the_gate_uses_the_pipelines_consensus_and_step(gate_ws, run_cli):
    """The consensus row counts what `audit` counts; the trust row is the written output's realized step."""
    _disagree(gate_ws)
    record(gate_ws, RUNS)
    workspace(gate_ws, extra="gate: {min_agree: 0.9}\n")
    audit = json.loads(run_cli("audit", "--ref", "v54-v54e2", "--dir", "v51-v28", "--format", "json").stdout)
    rows = rows_of(run_cli(*GATE, "--json"))
    assert rows["module consensus"]["numbers"]["agree"] == audit["summary"]["agree"] == 13
    assert rows["module consensus"]["numbers"]["modules"] == audit["summary"]["modules"] == 14
    res = run_cli(*PROJECT[:-2], "--on-disagree", "drop", "--out", "out/v58")
    assert res.exit_code == 0, res.output
    man = json.loads((gate_ws / "out" / "v58" / "vecmerge.json").read_text())
    gate = {r["condition"]: r for r in man["gate"]["rows"]}
    assert gate["small trust region"]["numbers"]["trust"] == man["resolved"]["realized"]["global"]
    assert gate["module consensus"]["numbers"] == rows["module consensus"]["numbers"]


def test_project_gate_passes_and_the_output_carries_the_table(gate_ws, run_cli):
    res = run_cli(*PROJECT)
    assert res.exit_code == 0, res.output
    assert "PASSED: all 7 conditions" in res.stdout
    man = json.loads((gate_ws / "out" / "v58" / "vecmerge.json").read_text())
    assert man["gate"]["passed"] and len(man["gate"]["rows"]) == 7
    assert man["gate"]["ledger"] == "vecmerge-evidence.db"  # portable: relative to the workspace
    card = (gate_ws / "out" / "v58" / "README.md").read_text()
    assert "Gate before writing (v54 + alpha * (v51 - v28), metric `official_total`): PASSED" in card
    assert card.count("| PASS |") == 7 and "Closeness of v51 to v28: cosine 0." in card
    assert run_cli("verify", "out/v58").exit_code == 0
    rep = json.loads(run_cli(*PROJECT, "--force", "--json").stdout)
    assert rep["gate"]["passed"] and rep["gate"]["rows"] == man["gate"]["rows"]
    res = run_cli("run", "out/v58/vecmerge.json", "--out", "again", "--json")
    assert res.exit_code == 0 and json.loads(res.stdout)["outputs"][0]["sha256"] == man["output"]["sha256"]


def test_the_manifest_of_a_gated_run_records_the_recipe_as_typed_and_a_rerun_gates_again(gate_ws, run_cli):
    """Issue 23: the gate relaxes its own base check to measure; the manifest said ``allow_base_mismatch: true``
    (never asked for) and had no ``gate``, so re-running it skipped the gate and the base check."""
    assert run_cli(*PROJECT).exit_code == 0
    man = json.loads((gate_ws / "out" / "v58" / "vecmerge.json").read_text())
    assert man["recipe"]["gate"] is True and "allow_base_mismatch" not in man["recipe"]
    rep = json.loads(run_cli("run", "out/v58/vecmerge.json", "--out", "again", "--json").stdout)
    assert rep["gate"]["passed"] and "allow_base_mismatch" not in rep["recipe"]
    (gate_ws / "vecmerge-evidence.db").unlink()  # without its evidence the re-run's gate cannot pass
    res = run_cli("run", "out/v58/vecmerge.json", "--out", "third")
    assert res.exit_code == 1 and "NOT PASSED" in res.stdout and res.stderr.startswith("error: gate: ")
    assert not (gate_ws / "third").exists()
    _edit_config(gate_ws, "v51", base_model_name_or_path="another/model")  # the base check runs again too
    (gate_ws / "rerun.yaml").write_text(json.dumps({**man["recipe"], "gate": None, "out": "fourth"}))
    res = run_cli("run", "rerun.yaml")
    assert res.exit_code == 2 and "base model" in res.stderr, res.output


def _nothing_written(root) -> None:
    assert not (root / "out").exists() or not any((root / "out").iterdir())
    assert not list(root.rglob(".v58*"))


@pytest.mark.parametrize("change, extra, condition", [
    (lambda r: None, ["--trust", "0.02"], "small trust region FAIL"),
    (lambda r: None, ["--dose", "1.456"], "small trust region FAIL"),  # v59: 0.0113 x 1.456 = 0.01645
    (lambda r: workspace(r, parents={}), [], "common parent UNKNOWN"),
    (lambda r: _disagree(r), [], "module consensus FAIL"),  # the gate's table, not only the consensus refusal
])
def test_project_gate_writes_nothing_when_the_gate_fails(gate_ws, run_cli, change, extra, condition):
    change(gate_ws)
    args = list(PROJECT)
    if "--trust" in extra:
        args[args.index("--trust") + 1] = extra[1]
    elif extra:
        args = args[:-2] + extra + args[-2:]
    res = run_cli(*args)
    assert res.exit_code == 1, res.output
    assert condition in res.stdout and "NOT PASSED" in res.stdout
    assert res.stderr.startswith("error: gate: ") and "nothing written" in res.stderr and res.stderr.count("\n") == 1
    _nothing_written(gate_ws)
    res = run_cli(*args, "--json")
    assert res.exit_code == 1 and json.loads(res.stdout)["gate"]["passed"] is False
    _nothing_written(gate_ws)


def test_a_recipe_gate_runs_the_gate_and_overrides_thresholds(gate_ws, run_cli):
    recipe = gate_ws / "v58.yaml"
    recipe.write_text("base: v54\ndir: v51 - v28\ntrust: 0.0113\nconsensus: {ref: v54 - v54e2}\nout: out/v58\n"
                      "gate: {max_trust: 0.01}\n")
    res = run_cli("run", "v58.yaml")
    assert res.exit_code == 1 and "small trust region FAIL" in res.stdout, res.output
    assert "recipe gate.max_trust" in res.stdout
    _nothing_written(gate_ws)
    recipe.write_text(recipe.read_text().replace("gate: {max_trust: 0.01}", "gate: true"))
    assert run_cli("run", "v58.yaml").exit_code == 0
    assert json.loads((gate_ws / "out" / "v58" / "vecmerge.json").read_text())["gate"]["passed"]
    recipe.write_text(recipe.read_text().replace("gate: true", "gate: {max_trust: -1, colour: red}"))
    res = run_cli("run", "v58.yaml", "--force")
    assert res.exit_code == 2 and "2 problems: colour: unknown key" in res.stderr and "max_trust=-1" in res.stderr
    res = run_cli("refactor", "v54", "--out", "x")
    assert res.exit_code == 0
    res = run_cli("project", "--base", "v54", "--dir", "v51-v28", "--trust", "0.01", "--metric", M, "--out", "o")
    assert res.exit_code == 2 and "--metric only means something with --gate" in res.stderr


def test_a_local_base_model_is_one_model_however_it_is_written(gate_ws, run_cli, tmp_path):
    """``base`` and its absolute path name one folder: the same base; a hub id stays as written."""
    from vecmerge.workspace.base_model import declared_base

    (gate_ws / "base").mkdir()
    _edit_config(gate_ws, "v28", base_model_name_or_path=str(gate_ws / "base"))
    for name in ("v51", "v54e2", "v54"):
        _edit_config(gate_ws, name, base_model_name_or_path="base")
    record(gate_ws, RUNS)  # the configs changed: record the runs of these weights
    rows = rows_of(run_cli(*GATE, "--json"))
    assert rows["common base"]["status"] == "PASS" and rows["common base"]["detail"] == "all on base, shapes match"
    assert declared_base("Qwen/Qwen3-0.6B") == "Qwen/Qwen3-0.6B" and declared_base(None) is None
    assert declared_base(str(tmp_path)) == str(tmp_path.resolve())


def test_a_base_declared_relative_to_the_workspace_is_one_model_from_any_folder(gate_ws, run_cli, tmp_path,
                                                                              monkeypatch):
    """Adapters declaring ``base`` (a folder of the workspace) and ``/w/base`` (its absolute path), run from another
    folder: ``project``'s base-model check and the gate's common-base row both see one base model (one normaliser,
    ``base_model.canonical``; the gate read ``base`` from the current folder before, so its row failed where
    ``project`` passed)."""
    (gate_ws / "base").mkdir()
    _edit_config(gate_ws, "v28", base_model_name_or_path=str(gate_ws / "base"))
    for name in ("v51", "v54e2", "v54"):
        _edit_config(gate_ws, name, base_model_name_or_path="base")
    record(gate_ws, RUNS)  # the configs changed: record the runs of these weights
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    flag = ["--workspace", str(gate_ws / "vecmerge.yaml")]
    rows = rows_of(run_cli(*flag, *GATE, "--json"))
    real = str((gate_ws / "base").resolve())
    assert rows["common base"]["status"] == "PASS", rows["common base"]
    assert rows["common base"]["numbers"]["base_models"] == {n: real for n in ("v54", "v51", "v28", "v54e2")}
    res = run_cli(*flag, "project", "--base", "v54", "--dir", "v51-v28", "--trust", "0.0113", "--out", "o")
    assert res.exit_code == 0, res.output
    assert run_cli(*flag, *PROJECT[:-2], "--out", "o2").exit_code == 0


def test_the_closeness_of_x_to_y_is_shown_and_exact(gate_ws, run_cli, dense_updates):
    """cos(v51, v28) and ||v51 - v28|| / ||v28|| against dense float64 updates (rel 1e-9)."""
    import torch

    rows = rows_of(run_cli(*GATE, "--json"))
    close = rows["common parent"]["numbers"]["closeness"]
    a, b = dense_updates(gate_ws / "v51"), dense_updates(gate_ws / "v28")
    inner = sum(float((a[m] * b[m]).sum()) for m in a)
    na, nb = (math.sqrt(sum(float((x[m] ** 2).sum()) for m in x)) for x in (a, b))
    dist = math.sqrt(sum(float(torch.sum((a[m] - b[m]) ** 2)) for m in a))
    assert close["cosine"] == pytest.approx(inner / (na * nb), rel=1e-9)
    assert close["relative_distance"] == pytest.approx(dist / nb, rel=1e-9)
    text = run_cli(*GATE).stdout
    assert "cos(v51, v28)" in text and f"= {close['cosine']:.4f}," in text  # (the cell wraps)


def record_subs(root, runs: dict) -> None:
    """Runs with sub-scores: name -> [(value, {sub: value})...], each tied to the adapter's sha256."""
    ws = Workspace(root=root)
    ledger = Ledger(ws.ledger_path)
    ledger.set_direction(M, True)
    for name, items in runs.items():
        ledger.add(name, ws.content_sha(name), M, [v for v, _ in items], subs=[s for _, s in items])


def test_the_gate_protects_the_sub_scores_named_in_vecmerge_yaml(toy, run_cli):
    """v51 keeps item understanding at 0.2453 in every run (decided exactly) and loses video beyond noise."""
    workspace(toy, extra="gate:\n  protect: [item_understanding, video]\n  margin: {video: 0.01}\n")
    video51, video28 = [0.2512, 0.2494, 0.2507, 0.2489, 0.2501], [0.3012, 0.2984]
    record_subs(toy, {"v51": [(v, {"item_understanding": 0.2453, "video": x}) for v, x in zip(V51, video51)],
                      "v28": [(v, {"item_understanding": 0.2453, "video": x}) for v, x in zip(V28, video28)],
                      "v54": [(v, {}) for v in V54]})
    res = run_cli(*GATE, "--json")
    assert res.exit_code == 1, res.output
    row = rows_of(res)["no sub-score regresses"]
    assert row["status"] == "FAIL" and row["detail"].startswith("video worse (-0.04974: worse beyond noise (Holm p")
    assert row["source"] == "protect vecmerge.yaml gate.protect; margin vecmerge.yaml gate.margin"
    subs = row["numbers"]["subscores"]
    assert subs["item_understanding"]["status"] == "not_worse" and subs["item_understanding"]["kind"] == "exact"
    assert subs["video"]["margin"] == 0.01 and subs["video"]["margin_source"] == "vecmerge.yaml gate.margin"
    text = run_cli(*GATE).stdout
    assert "NOT PASSED: no sub-score regresses FAIL" in text
    workspace(toy, extra="gate:\n  protect: [item_understanding]\n")  # video is not protected: it may move
    assert run_cli(*GATE).exit_code == 0


def test_a_plan_of_x_against_y_decides_the_repeated_evidence_row(gate_ws, run_cli):
    assert run_cli("evidence", "plan", "v51", "--vs", "v28", "--min-effect", "0.01", "--max-runs", "6").exit_code == 0
    row = rows_of(run_cli(*GATE, "--json"))["repeated evidence"]
    assert row["status"] == "UNKNOWN" and row["detail"].startswith("continue after 0 + 0 planned runs")
    assert row["source"].startswith("evidence plan 1 (")
    ws = Workspace(root=gate_ws)
    ledger = Ledger(ws.ledger_path)
    for i in range(4):
        ledger.add("v51", ws.content_sha("v51"), M, 1.03 + 0.001 * i)
        ledger.add("v28", ws.content_sha("v28"), M, 0.98 - 0.001 * i)
    res = run_cli(*GATE, "--json")
    assert res.exit_code == 0 and rows_of(res)["repeated evidence"]["numbers"]["decision"]["decision"] == "stop_better"


def test_a_replicate_of_the_backbone_in_the_workspace_brings_training_noise_into_the_gate(gate_ws, run_cli):
    """Issue 28 end to end: v54b (declared replicate_of: v54; a copy of its folder stands in for another seed)
    scores 0.02 higher: the backbone's training plus evaluation noise is far above the ledger's eval noise."""
    import shutil

    assert rows_of(run_cli(*GATE, "--json"))["stable backbone"]["status"] == "PASS"
    shutil.copytree(gate_ws / "v54", gate_ws / "v54b")
    text = (gate_ws / "vecmerge.yaml").read_text()
    (gate_ws / "vecmerge.yaml").write_text(text.replace("metric:", "  v54b: {path: v54b, replicate_of: v54}\nmetric:"))
    record(gate_ws, {"v54b": [1.0140, 1.0150, 1.0146]})
    res = run_cli(*GATE, "--json")
    assert res.exit_code == 1, res.output
    row = rows_of(res)["stable backbone"]
    assert row["status"] == "FAIL" and row["numbers"]["noise"] == "training plus evaluation"
    assert row["numbers"]["components"]["members"] == ["v54", "v54b"]
    assert "2 trainings (v54, v54b), 6 runs; training plus evaluation noise sd" in row["detail"]
