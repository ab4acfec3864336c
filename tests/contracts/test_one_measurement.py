"""Runs made under different eval environments are never pooled nor compared as one measurement (issue 28).

Every command that pools records (show, compare, calibrate, decide, gate, ls) is run over one ledger holding the
same models under two environments (a task timeout of 180 s and of 900 s, Terminal-Bench 2's lesson): each splits
or refuses, naming the field that differs, and does the work once ``--env`` picks one.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

FIX = Path(__file__).parents[1] / "fixtures" / "lm_eval"
WORKSPACE = """adapters:
  v28: {path: v28, parent: null}
  v51: {path: v51, parent: v28}
  v54e2: {path: v54e2, parent: null}
  v54: {path: v54, parent: v54e2}
metric: tb2
"""
SHORT = {"v51": [0.463, 0.470, 0.466], "v28": [0.450, 0.452, 0.455], "v54": [0.460, 0.461, 0.462]}
LONG = {"v51": [0.6097, 0.6050], "v28": [0.58, 0.59], "v54": [0.60, 0.61]}


def ok(res, code: int = 0):
    assert res.exit_code == code, res.output
    return res


def refused(res) -> str:
    assert res.exit_code == 2, res.output
    (line,) = res.stderr.strip().splitlines()
    assert line.startswith("error: ") and "Traceback" not in res.output
    return line


@pytest.fixture
def mixed(toy, run_cli):
    (toy / "vecmerge.yaml").write_text(WORKSPACE)
    for runs, timeout in ((SHORT, 180), (LONG, 900)):
        for model, values in runs.items():
            ok(run_cli("evidence", "add", model, *values, "--env", f"timeout={timeout}", "--env", "harness=tb2",
                       "--higher-is-better"))
    return toy


def test_show_splits_environments_and_by_env_names_their_fields(mixed, run_cli):
    out = json.loads(ok(run_cli("evidence", "show", "--json")).stdout)
    assert len(out["environments"]) == 2 and {e["fields"]["timeout"] for e in out["environments"]} == {"180", "900"}
    assert len([s for s in out["summaries"] if s["model"] == "v51"]) == 2  # one summary per environment
    text = ok(run_cli("evidence", "show")).stdout
    assert "never pooled with the others" in text and " env " in text.splitlines()[0]
    by = ok(run_cli("evidence", "show", "--by", "env")).stdout
    ids = [e["id"] for e in out["environments"]]
    assert f"environment {ids[0]}: harness=tb2, timeout=180" in by and f"environment {ids[1]}: harness=tb2, " \
                                                                       "timeout=900" in by
    only = json.loads(ok(run_cli("evidence", "show", "--env", "timeout=900", "--json")).stdout)
    assert {s["env"] for s in only["summaries"]} == {ids[1]}


def test_compare_refuses_two_environments_naming_the_field_until_one_is_picked(mixed, run_cli):
    line = refused(run_cli("evidence", "compare", "v51", "v28"))
    assert "not the same measurement" in line and "differ in timeout (180 in" in line and "--env" in line
    short = json.loads(ok(run_cli("evidence", "compare", "v51", "v28", "--env", "timeout=180", "--json")).stdout)
    assert short["env"]["fields"] == {"harness": "tb2", "timeout": "180"} and short["a_summary"]["n"] == 3
    assert short["pooled"]["df"] == 6  # the noise of 180 s runs only: 3 models x (3 - 1)
    long_id = [e["id"] for e in json.loads(run_cli("evidence", "show", "--json").stdout)["environments"]][1]
    long = json.loads(ok(run_cli("evidence", "compare", "v51", "v28", "--env", long_id[:6], "--json")).stdout)
    assert long["a_summary"]["n"] == 2 and long["env"]["id"] == long_id
    text = ok(run_cli("evidence", "compare", "v51", "v28", "--env", "timeout=180")).stdout
    assert f"eval environment {short['env']['id']}: harness=tb2, timeout=180" in text


def test_calibrate_decide_and_ls_never_pool(mixed, run_cli):
    ok(run_cli("evidence", "add", "v51", "0.9", "--metric", "local", "--higher-is-better"))
    line = refused(run_cli("evidence", "calibrate", "--proxy", "local", "--target", "tb2", "--min-models", "3"))
    assert line.startswith("error: calibrate: tb2: not the same measurement") and "timeout" in line
    ids = {e["fields"].get("timeout"): e["id"] for e in json.loads(run_cli("evidence", "show", "--json").stdout)[
        "environments"]}
    out = json.loads(ok(run_cli("evidence", "calibrate", "--proxy", "local", "--target", "tb2", "--min-models", "3",
                                "--env", ids["900"], "--env", ids[None], "--json")).stdout)  # one id per metric
    assert out["environments"]["tb2"]["fields"]["timeout"] == "900" and out["environments"]["local"]["fields"] == {}
    ok(run_cli("evidence", "plan", "v51", "--vs", "v28", "--min-effect", "0.01", "--max-runs", "6"))
    for model, value, timeout in (("v51", 0.47, 180), ("v28", 0.45, 180), ("v51", 0.61, 900), ("v28", 0.59, 900)):
        ok(run_cli("evidence", "add", model, str(value), "--env", f"timeout={timeout}", "--env", "harness=tb2"))
    assert "not the same measurement" in refused(run_cli("evidence", "decide", "v51", "--vs", "v28"))
    ok(run_cli("evidence", "decide", "v51", "--vs", "v28", "--env", "timeout=900"))
    rows = {r["name"]: r for r in json.loads(ok(run_cli("ls", "--json")).stdout)["adapters"]}
    assert rows["v51"]["environments"] == 2 and rows["v51"]["mean"] is None and rows["v51"]["runs"] == 7
    assert "- (2 environments)" in ok(run_cli("ls")).stdout


def test_the_gate_refuses_two_environments_and_uses_the_one_picked(mixed, run_cli):
    gate = ["gate", "--base", "v54", "--dir", "v51-v28", "--consensus-ref", "v54-v54e2", "--trust", "0.0113"]
    line = refused(run_cli(*gate))
    assert line.startswith("error: gate: v54, v51 and v28 on tb2: not the same measurement") and "timeout" in line
    res = run_cli(*gate, "--env", "timeout=180", "--json")
    assert res.exit_code in (0, 1), res.output
    out = json.loads(res.stdout)
    assert out["env"]["fields"]["timeout"] == "180"
    rows = {r["condition"]: r for r in out["rows"]}
    assert rows["stable backbone"]["numbers"]["runs"] == 3 and rows["repeated evidence"]["numbers"]["welch"]["n"] == [
        3, 3]


def test_lm_eval_runs_of_different_generation_settings_are_not_compared(toy, run_cli, tmp_path):
    """The real lm-eval results, one re-run with temperature 0.7 (lm-eval's --gen_kwargs): v51's two runs are
    different measurements from v28's one unless the environment is picked."""
    (toy / "vecmerge.yaml").write_text(WORKSPACE)
    data = json.loads((FIX / "v51_results.json").read_text())
    data["config"]["gen_kwargs"] = {"temperature": 0.7}
    (toy / "hot.json").write_text(json.dumps(data))
    ok(run_cli("evidence", "import", str(FIX / "v51_results.json")))
    ok(run_cli("evidence", "import", str(FIX / "v28_results.json")))
    ok(run_cli("evidence", "import", "hot.json"))
    metric = "toy_gen/exact_match/first-word"
    line = refused(run_cli("evidence", "compare", "adapters/v51", "adapters/v28", "--metric", metric))
    assert "not the same measurement" in line and "temperature (unrecorded in" in line
    cold = json.loads(run_cli("evidence", "show", "adapters/v28", "--metric", metric, "--json").stdout)["environments"]
    out = json.loads(ok(run_cli("evidence", "compare", "adapters/v51", "adapters/v28", "--metric", metric, "--env",
                                cold[0]["id"], "--json")).stdout)
    assert out["a_summary"]["n"] == 1 and "temperature" not in out["env"]["fields"]
    text = ok(run_cli("evidence", "show", "--metric", metric, "--by", "env")).stdout
    assert "harness=lm-eval, harness_version=0.4.13" in text and "temperature=0.7" in text
