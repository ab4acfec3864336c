"""Importers: CSV, and the real lm-eval 0.4.13 output in tests/fixtures/lm_eval (see its README).

A malformed file gets ONE error line naming the file, the row and the field, and nothing is written."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from vecmerge.evidence import EvidenceError
from vecmerge.evidence.importers.importers import (
    detect_kind,
    export_csv_text,
    import_files,
    lm_eval_model,
    parse_csv,
    parse_lm_eval_results,
    parse_lm_eval_samples,
)
from vecmerge.evidence.ledger.ledger import Ledger

FIX = Path(__file__).parents[2] / "fixtures" / "lm_eval"
SHA = "c" * 64


@pytest.fixture
def ledger(tmp_path) -> Ledger:
    return Ledger(tmp_path / "ev.db")


def write(tmp_path, name, text) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_csv_with_every_column(tmp_path):
    path = write(tmp_path, "scores.csv",
                 "model,metric,value,note,sub.video,sub.item,item,cluster,stderr,sha256\n"
                 f"v51,official_total,1.0180,run 1,0.31,0.2453,,,,{SHA}\n"
                 "\n"
                 "v51,official_total,0.9895,,,,,,0.01,\n"
                 "v51,toy/acc,1,,,,doc7,topic2,,\n")
    parsed = parse_csv(path)
    a, b, c = parsed.entries
    assert (a.model, a.metric, a.value, a.note, a.sha256) == ("v51", "official_total", 1.0180, "run 1", SHA)
    assert dict(a.subs) == {"video": 0.31, "item": 0.2453}
    assert (b.subs, b.stderr, b.sha256, b.note) == ((), 0.01, None, None)
    assert (c.item, c.cluster, c.value) == ("doc7", "topic2", 1.0)
    assert a.source == f"csv:{path}"


@pytest.mark.parametrize("body, where, field", [
    ("model,metric,value\nv51,m,1.0\nv51,m,abc\n", "line 3", "value"),
    ("model,metric,value\nv51,m,1.0\nv51,m,nan\n", "line 3", "value"),
    ("model,metric,value\nv51,m,1.0\nv51,m,inf\n", "line 3", "value"),
    ("model,metric,value\n,m,1.0\n", "line 2", "model"),
    ("model,metric,value\nv51,,1.0\n", "line 2", "metric"),
    ("model,metric,value,sub.video\nv51,m,1.0,0.3\nv51,m,1.0,x\n", "line 3", "sub.video"),
    ("model,metric,value,cluster\nv51,m,1.0,c1\n", "line 2", "cluster"),
    ("model,metric,value,sha256\nv51,m,1.0,abc\n", "line 2", "sha256"),
    ("model,metric,value,stderr\nv51,m,1.0,-0.1\n", "line 2", "stderr"),
    ("model,metric,vaule\nv51,m,1.0\n", "line 1", "vaule"),
    ("model,metric\nv51,m\n", "line 1", "value"),
    ("model,metric,value,value\nv51,m,1.0,2.0\n", "line 1", "value"),
])
def test_malformed_csv_one_line_naming_row_and_field_writes_nothing(tmp_path, ledger, body, where, field):
    path = write(tmp_path, "bad.csv", body)
    with pytest.raises(EvidenceError) as info:
        import_files(ledger, [path])
    msg = str(info.value)
    assert "\n" not in msg
    assert msg.startswith(f"{path}: {where}, field '{field}'"), msg
    assert msg.endswith("nothing was recorded")
    assert ledger.records() == [] and not ledger.path.exists()


def test_csv_row_with_wrong_field_count_and_the_count_of_further_problems(tmp_path):
    path = write(tmp_path, "bad.csv", "model,metric,value\nv51,m,1.0,extra\nv51,m,x\nv51,m,y\n")
    with pytest.raises(EvidenceError, match=r"bad.csv: line 2: 4 fields, the header has 3 "
                                            r"\(and 2 more problems: line 3 'value', line 4 'value'\)"):
        parse_csv(path)


def test_csv_line_numbers_count_quoted_line_breaks(tmp_path):
    path = write(tmp_path, "q.csv", 'model,metric,value,note\nv51,m,1.0,"two\nlines"\nv51,m,bad,\n')
    with pytest.raises(EvidenceError, match=r"q.csv: line 4, field 'value'"):
        parse_csv(path)


def test_csv_export_round_trip(tmp_path, ledger):
    ledger.add("v51", SHA, "official_total", [1.0180, 0.9895], subs=[{"item": 0.2453}, {}], note="a, b")
    ledger.add_items("v51", SHA, "toy/acc", {"d1": 1.0}, clusters={"d1": "t"})
    path = write(tmp_path, "out.csv", export_csv_text(ledger.export()))
    again = Ledger(tmp_path / "again.db")
    import_files(again, [path])
    keys = ("model", "sha256", "metric", "value", "subs", "stderr", "item", "cluster", "note")
    first = [tuple(getattr(r, k) for k in keys) for r in ledger.records()]
    assert first == [tuple(getattr(r, k) for k in keys) for r in again.records()]
    assert len(first) == 3


def test_lm_eval_results_fixture():
    parsed = parse_lm_eval_results(FIX / "v51_results.json")
    raw = json.loads((FIX / "v51_results.json").read_text())["results"]
    got = {e.metric: (e.model, e.value, e.stderr) for e in parsed.entries}
    name = "adapters/v51"  # no workspace: the model is the peft= path as written
    assert got == {
        "toy_mc/acc": (name, raw["toy_mc"]["acc,none"], raw["toy_mc"]["acc_stderr,none"]),
        "toy_mc/acc_norm": (name, raw["toy_mc"]["acc_norm,none"], raw["toy_mc"]["acc_norm_stderr,none"]),
        "toy_gen/exact_match/first-word": (name, raw["toy_gen"]["exact_match,first-word"],
                                           raw["toy_gen"]["exact_match_stderr,first-word"]),
    }
    assert parsed.directions == {"toy_mc/acc": True, "toy_mc/acc_norm": True,
                                 "toy_gen/exact_match/first-word": True}
    assert {e.model for e in parse_lm_eval_results(FIX / "v51_results.json", model="mine").entries} == {"mine"}


def test_lm_eval_model_is_the_path_as_written_without_a_workspace(tmp_path):
    here = tmp_path / "results.json"
    assert lm_eval_model({"model_name": "adapters/v51"}, here) == "adapters/v51"
    assert lm_eval_model({"config": {"model_args": "pretrained=base,peft=runs/v28/"}}, here) == "runs/v28"
    assert lm_eval_model({"config": {"model_args": {"pretrained": "Qwen/Qwen3-0.6B"}}}, here) == "Qwen/Qwen3-0.6B"
    assert lm_eval_model({"config": {}}, here) is None


def epoch3_results(tmp_path, peft: str, name: str) -> Path:
    data = json.loads((FIX / "v51_results.json").read_text())
    data["config"]["model_args"]["peft"] = data["model_name"] = peft
    folder = tmp_path / "evals" / name
    folder.mkdir(parents=True)
    return write(folder, "results.json", json.dumps(data))


def test_lm_eval_models_are_matched_to_workspace_adapters_by_their_path(tmp_path, ledger):
    """Issue 23: runs/v54/epoch3 (a workspace adapter, v54) and runs/v60/epoch3 (not one) were both "epoch3" and
    pooled; each is now its own model, matched by the path relative to the workspace or to the results file."""
    adapters = {"v54": tmp_path / "runs" / "v54" / "epoch3", "v51": tmp_path / "evals" / "b" / "adapters" / "v51"}
    a = epoch3_results(tmp_path, "runs/v54/epoch3", "a")          # relative to the workspace
    b = epoch3_results(tmp_path, "runs/v60/epoch3", "c")          # no adapter there
    c = epoch3_results(tmp_path, "adapters/v51", "b")             # relative to the results file
    d = epoch3_results(tmp_path, str(tmp_path / "runs/v54/epoch3/"), "d")  # absolute
    models = [parse_lm_eval_results(p, adapters=adapters, home=tmp_path).entries[0].model for p in (a, b, c, d)]
    assert models == ["v54", "runs/v60/epoch3", "v51", "v54"]
    out = import_files(ledger, [a, b], adapters=adapters, home=tmp_path)
    assert out["models"] == ["runs/v60/epoch3", "v54"]
    assert {r.model: 1 for r in ledger.records(metric="toy_mc/acc")} == {"v54": 1, "runs/v60/epoch3": 1}


def test_an_ambiguous_lm_eval_model_path_is_refused_naming_the_candidates(tmp_path, ledger):
    path = epoch3_results(tmp_path, "epoch3", "x")
    adapters = {"v54": tmp_path / "epoch3", "v60": tmp_path / "evals" / "x" / "epoch3"}
    with pytest.raises(EvidenceError) as info:
        import_files(ledger, [path], adapters=adapters, home=tmp_path)
    text = str(info.value)
    assert "is ambiguous: v60 relative to the results file; v54 relative to the workspace" in text
    assert "--model" in text and "\n" not in text and not ledger.path.exists()
    assert import_files(ledger, [path], adapters=adapters, home=tmp_path, model="v60")["models"] == ["v60"]


@pytest.mark.parametrize("name", ["v28", "v51"])
def test_lm_eval_samples_mean_equals_the_results_value(name):
    """Independent check: lm-eval aggregated each metric itself (mean over documents); the item-level
    records we read from --log_samples must average to exactly that value."""
    results = {e.metric: e.value for e in parse_lm_eval_results(FIX / f"{name}_results.json").entries}
    for task in ("toy_mc", "toy_gen"):
        entries = parse_lm_eval_samples(FIX / f"{name}_samples_{task}.jsonl", name, cluster_field="topic").entries
        for metric in {e.metric for e in entries}:
            values = [e.value for e in entries if e.metric == metric]
            assert len(values) == 12
            assert sum(values) / len(values) == pytest.approx(results[metric], abs=1e-12)
        assert {e.cluster for e in entries} == {"colour", "animal", "number", "yesno"}
        assert sorted({int(e.item) for e in entries}) == list(range(12))


def test_import_results_with_samples_in_one_transaction(ledger):
    files = [FIX / "v51_results.json", FIX / "v51_samples_toy_mc.jsonl", FIX / "v51_samples_toy_gen.jsonl"]
    out = import_files(ledger, files, sha_of={"v51": SHA}, cluster_field="topic",
                       adapters={"v51": ledger.path.parent / "adapters" / "v51"}, home=ledger.path.parent)
    assert out["records"] == 3 + 2 * 12 + 12 and out["item_level"] == 36 and out["models"] == ["v51"]
    assert out["directions"]["toy_mc/acc"] is True and ledger.direction("toy_mc/acc") is True
    assert {r.sha256 for r in ledger.records()} == {SHA}
    sha = hashlib.sha256(files[0].read_bytes()).hexdigest()  # the file's content: one import of it counts
    assert {r.source for r in ledger.records(level="run")} == {f"lm-eval:{files[0]}@{sha}"}


def test_samples_need_a_model_name(ledger):
    with pytest.raises(EvidenceError, match="does not name its model"):
        import_files(ledger, [FIX / "v51_samples_toy_mc.jsonl"])
    with pytest.raises(EvidenceError, match="does not name its model"):  # two results files: ambiguous
        import_files(ledger, [FIX / "v28_results.json", FIX / "v51_results.json", FIX / "v51_samples_toy_mc.jsonl"])
    assert ledger.records() == []


def test_malformed_results_json(tmp_path, ledger):
    data = json.loads((FIX / "v51_results.json").read_text())
    data["results"]["toy_mc"]["acc_norm,none"] = "oops"
    bad = write(tmp_path, "results.json", json.dumps(data))
    with pytest.raises(EvidenceError, match=r"results.json: results.toy_mc, field 'acc_norm,none': 'oops' is not"):
        import_files(ledger, [FIX / "v28_results.json", bad])  # the good file is not written either
    broken = write(tmp_path, "broken.json", '{"results": {\n"t": {"acc,none": 1.0,}}}')
    with pytest.raises(EvidenceError, match=r"broken.json: line 2: not valid JSON"):
        import_files(ledger, [broken])
    with pytest.raises(EvidenceError, match="no 'results' mapping"):
        import_files(ledger, [write(tmp_path, "other.json", '{"a": 1}')])
    assert ledger.records() == []


def test_malformed_samples_line(tmp_path, ledger):
    lines = (FIX / "v51_samples_toy_mc.jsonl").read_text().splitlines()
    row = json.loads(lines[4])
    row["acc"] = None
    lines[4] = json.dumps(row)
    lines[7] = lines[7][:50]
    bad = write(tmp_path, "samples_toy_mc_2026-01-01T00-00-00.000.jsonl", "\n".join(lines) + "\n")
    with pytest.raises(EvidenceError) as info:
        import_files(ledger, [bad], model="v51")
    assert str(info.value).startswith(f"{bad}: line 5, field 'acc': None is not a number (and 1 more problem: line 8)")
    assert ledger.records() == []
    row = json.loads(lines[0])
    del row["doc"]["topic"]
    write(tmp_path, "samples_toy_mc.jsonl", json.dumps(row) + "\n")
    with pytest.raises(EvidenceError, match=r"line 1, field 'doc.topic'"):
        parse_lm_eval_samples(tmp_path / "samples_toy_mc.jsonl", "v51", cluster_field="topic")


def test_a_direction_conflict_with_the_ledger_writes_nothing(ledger):
    ledger.set_direction("toy_mc/acc", False)
    with pytest.raises(EvidenceError, match="already says lower is better"):
        import_files(ledger, [FIX / "v51_results.json"])
    assert ledger.records() == []


def test_detect_kind():
    assert [detect_kind(p) for p in ("a.csv", "r.json", "s.jsonl")] == ["csv", "results", "samples"]
    with pytest.raises(EvidenceError, match="unknown kind"):
        detect_kind("scores.xlsx")


def test_the_users_published_scores_import_and_match_the_stated_figures(ledger):
    """examples/evidence/scores.csv: the account states v51's mean 1.00652 and range 0.0285; the file must
    reproduce them (a check of the transcription), and every row must import."""
    examples = Path(__file__).parents[3] / "examples" / "evidence"
    out = import_files(ledger, [examples / "scores.csv", examples / "history.csv"])
    assert out["records"] == 12 + 15 and out["metrics"] == ["official_total"]
    v51 = [r.value for r in ledger.records(models=["v51"])]
    assert sum(v51) / 5 == pytest.approx(1.00652, abs=1e-12) and max(v51) - min(v51) == pytest.approx(0.0285)
    assert {r.sub_scores.get("item_understanding") for r in ledger.records(models=["v51"])} == {0.2453}
    assert "v54" not in ledger.models()  # only its mean of three runs is published


def test_csv_item_rows_name_their_sub_score_and_round_trip(tmp_path, ledger):
    path = write(tmp_path, "items.csv",
                 "model,metric,value,item,subscore,sub.start_low\n"
                 "v51,toy_acc,0.5,,,0.4\n"
                 "v51,toy_acc,1,seq3,start_low,\n"
                 "v51,toy_acc,0,seq9,start_high,\n")
    run, low, high = parse_csv(path).entries
    assert dict(run.subs) == {"start_low": 0.4} and run.subscore is None
    assert (low.item, low.subscore, high.subscore) == ("seq3", "start_low", "start_high")
    import_files(ledger, [path])
    text = export_csv_text(ledger.export())
    assert text.splitlines()[0].endswith(",subscore,sub.start_low")
    again = write(tmp_path, "again.csv", text)
    assert [(e.item, e.subscore, dict(e.subs)) for e in parse_csv(again).entries] == [
        (None, None, {"start_low": 0.4}), ("seq3", "start_low", {}), ("seq9", "start_high", {})]
    bad = write(tmp_path, "bad.csv", "model,metric,value,subscore\nv51,toy_acc,0.5,start_low\n")
    with pytest.raises(EvidenceError, match=r"line 2, field 'subscore': names the sub-score of an item"):
        parse_csv(bad)


def group_results(tmp_path) -> Path:
    """The v51 fixture plus a second multiple-choice task and two groups, laid out as lm-eval 0.4 writes them
    (``results`` holds each group's aggregate beside its tasks; ``group_subtasks`` maps a group to its tasks,
    a nested group included, and a task to []). Constructed: the fixture itself has no group."""
    data = json.loads((FIX / "v51_results.json").read_text())
    data["results"]["toy_mc2"] = {"alias": " - toy_mc2", "acc,none": 0.5, "acc_stderr,none": 0.15,
                                  "acc_norm,none": 0.25, "acc_norm_stderr,none": 0.13}
    mc = data["results"]["toy_mc"]["acc,none"]
    data["results"]["toy_mcs"] = {"alias": "toy_mcs", "acc,none": (mc + 0.5) / 2, "acc_stderr,none": "N/A"}
    data["results"]["toy_all"] = {"alias": "toy_all", "acc,none": (mc + 0.5) / 2, "acc_stderr,none": "N/A"}
    data["group_subtasks"] = {"toy_all": ["toy_mcs", "toy_gen"], "toy_mcs": ["toy_mc", "toy_mc2"], "toy_mc": [],
                              "toy_mc2": [], "toy_gen": []}
    return write(tmp_path, "results_group.json", json.dumps(data))


def test_each_task_of_an_lm_eval_group_is_a_sub_score_of_the_groups_run(tmp_path):
    parsed = parse_lm_eval_results(group_results(tmp_path))
    by = {e.metric: e for e in parsed.entries}
    mc = json.loads((FIX / "v51_results.json").read_text())["results"]["toy_mc"]["acc,none"]
    assert dict(by["toy_mcs/acc"].subs) == {"toy_mc": mc, "toy_mc2": 0.5}
    assert dict(by["toy_all/acc"].subs) == {"toy_mcs": (mc + 0.5) / 2}  # toy_gen has no acc: not a sub-score of acc
    assert by["toy_mc/acc"].subs == () and by["toy_mc2/acc_norm"].subs == ()  # tasks stay metrics of their own
    assert by["toy_mcs/acc"].stderr is None and by["toy_mcs/acc"].model == "adapters/v51"


# -- eval environments (issue 28) -------------------------------------------------------------------------------------
def test_the_real_lm_eval_results_are_read_with_their_environment():
    """Each task's environment from the file itself: harness version, transformers, the task's version, n-shot,
    documents' hash, seeds, dtype, max_length and (toy_gen) the generation settings; toy_mc has none of those."""
    raw = json.loads((FIX / "v51_results.json").read_text())
    by = {e.metric: dict(e.env) for e in parse_lm_eval_results(FIX / "v51_results.json").entries}
    common = {"harness": "lm-eval", "harness_version": raw["lm_eval_version"],
              "transformers_version": raw["transformers_version"], "n_shot": "0", "task_version": "1",
              "seed": str(raw["config"]["random_seed"]), "fewshot_seed": str(raw["config"]["fewshot_seed"]),
              "dtype": raw["config"]["model_args"]["dtype"], "max_length": str(raw["max_length"])}
    assert common["harness_version"] == "0.4.13" and raw["versions"]["toy_mc"] == 1.0
    assert by["toy_mc/acc"] == {**common, "task_hash": raw["task_hashes"]["toy_mc"]} == by["toy_mc/acc_norm"]
    gen = raw["configs"]["toy_gen"]["generation_kwargs"]
    assert gen == {"until": ["."], "max_gen_toks": 3, "do_sample": False}
    assert by["toy_gen/exact_match/first-word"] == {**common, "task_hash": raw["task_hashes"]["toy_gen"],
                                                    "stop": ".", "max_tokens": "3", "do_sample": "false"}
    v28 = {e.metric: e.environment.id for e in parse_lm_eval_results(FIX / "v28_results.json").entries}
    v51 = {e.metric: e.environment.id for e in parse_lm_eval_results(FIX / "v51_results.json").entries}
    assert v28 == v51 and len(set(v51.values())) == 2  # one run setup, two tasks: two environments


def test_samples_take_the_environment_of_their_task_in_the_results_file(ledger):
    files = [FIX / "v51_results.json", FIX / "v51_samples_toy_mc.jsonl"]
    out = import_files(ledger, files)
    runs = {r.metric: r.environment.id for r in ledger.records(level="run")}
    items = {r.environment.id for r in ledger.records(level="item")}
    assert items == {runs["toy_mc/acc"]} and set(out["environments"]) == set(runs.values())


def test_an_edited_results_file_is_another_environment(tmp_path):
    """The user's lesson: max tokens, temperature and timeouts move scores; the edited run is not the same
    measurement (another id, the fields that differ named)."""
    data = json.loads((FIX / "v51_results.json").read_text())
    data["config"]["gen_kwargs"] = "temperature=0.7,max_gen_toks=64"  # lm-eval's --gen_kwargs, as it records them
    edited = write(tmp_path, "results.json", json.dumps(data))
    a = {e.metric: e for e in parse_lm_eval_results(FIX / "v51_results.json").entries}
    b = {e.metric: e for e in parse_lm_eval_results(edited).entries}
    m = "toy_gen/exact_match/first-word"
    from vecmerge.evidence.ledger.environment import differing

    assert differing(a[m].environment, b[m].environment) == [("max_tokens", "3", "64"), ("temperature", None, "0.7")]


def test_csv_env_columns_and_export_round_trip(tmp_path, ledger):
    path = write(tmp_path, "tb2.csv", "model,metric,value,env.harness,env.timeout,env.temperature\n"
                                      "v51,tb2,0.463,terminal-bench,180,0\n"
                                      "v51,tb2,0.6097,terminal-bench,900.0,\n")
    a, b = parse_csv(path).entries
    assert dict(a.env) == {"harness": "terminal-bench", "timeout": "180", "temperature": "0"}
    assert dict(b.env) == {"harness": "terminal-bench", "timeout": "900"} and a.environment.id != b.environment.id
    import_files(ledger, [path])
    text = export_csv_text(ledger.export())
    assert text.splitlines()[0].endswith(",env_id,env.harness,env.temperature,env.timeout")
    again = Ledger(tmp_path / "again.db")
    import_files(again, [write(tmp_path, "again.csv", text)])
    assert [r.env for r in again.records()] == [r.env for r in ledger.records()]


@pytest.mark.parametrize("header, cell, match", [("env.bad key", "1", "environment field 'bad key'"),
                                                 ("env.t", "a\x07b", "control character")])
def test_bad_env_cells_are_one_line(tmp_path, header, cell, match):
    path = write(tmp_path, "bad.csv", f"model,metric,value,{header}\nv51,m,1.0,{cell}\n")
    with pytest.raises(EvidenceError, match=match):
        parse_csv(path)


def test_env_options_add_fields_and_refuse_a_contradiction(tmp_path, ledger):
    path = write(tmp_path, "s.csv", "model,metric,value,env.timeout\nv51,m,1.0,180\nv51,m,1.1,\n")
    import_files(ledger, [path], env={"sandbox_cpus": "2"})
    assert [dict(r.env) for r in ledger.records()] == [{"sandbox_cpus": "2", "timeout": "180"}, {"sandbox_cpus": "2"}]
    with pytest.raises(EvidenceError, match=r"--env timeout=900: .*s.csv records timeout=180 for v51"):
        import_files(ledger, [path], env={"timeout": "900"})


# -- issue 23: directions are booleans; CSV cells and terminal text are safe ---------------------------------------
@pytest.mark.parametrize("flag", ["yes", 1, None, "true"])
def test_an_lm_eval_direction_must_be_a_boolean(tmp_path, ledger, flag):
    data = json.loads((FIX / "v51_results.json").read_text())
    data["higher_is_better"]["toy_mc"]["acc"] = flag
    bad = write(tmp_path, "results.json", json.dumps(data))
    with pytest.raises(EvidenceError, match=rf"higher_is_better.toy_mc, field 'acc': {flag!r} is not a direction"):
        import_files(ledger, [bad])
    assert not ledger.path.exists()


def test_a_csv_direction_column_is_not_accepted(tmp_path):
    """CSV files carry no direction (the --higher-is-better flags and lm-eval do): a column is refused, not read."""
    path = write(tmp_path, "d.csv", "model,metric,value,higher_is_better\nv51,m,1.0,yes\n")
    with pytest.raises(EvidenceError, match="field 'higher_is_better': unknown column"):
        parse_csv(path)


def test_export_neutralises_formulas_and_strips_escapes(tmp_path, ledger):
    """OWASP's CSV injection: cells starting with = + - @ (not numbers), tab or CR are quoted; escape sequences
    and control characters are removed; numbers, negative ones included, stay numbers; re-import gives the text."""
    import csv
    import io

    from vecmerge.evidence.ledger.records import Entry

    note = "\x1b]8;;http://evil\x07click\x1b]8;;\x07\tme"
    ledger.write([Entry("=HYPERLINK(\"http://evil\",\"v51\")", "@SUM(A1:A9)", -0.5, note=note,
                        source="+cmd|' /C calc'!A0")])
    text = export_csv_text(ledger.export())

    (row,) = list(csv.DictReader(io.StringIO(text)))
    assert row["model"] == "'=HYPERLINK(\"http://evil\",\"v51\")" and row["metric"] == "'@SUM(A1:A9)"
    assert row["value"] == "-0.5" and row["note"] == "click me" and row["source"] == "'+cmd|' /C calc'!A0"
    assert "\x1b" not in text and "\x07" not in text
    again = Ledger(tmp_path / "again.db")
    import_files(again, [write(tmp_path, "x.csv", text)])
    (rec,) = again.records()
    assert (rec.model, rec.metric, rec.value, rec.note) == ("=HYPERLINK(\"http://evil\",\"v51\")", "@SUM(A1:A9)", -0.5,
                                                            "click me")


def test_names_with_nul_or_escapes_are_refused(ledger):
    from vecmerge.evidence.ledger.records import Entry

    for name in ("v5\x001", "v51\x1b[2J", "v51\x9b"):
        with pytest.raises(EvidenceError, match="control character"):
            ledger.write([Entry(name, "m", 1.0)])
    assert not ledger.path.exists()


@pytest.mark.parametrize("header, row, field", [
    ("model,metric,value", "v28,acc," + "9" * 100_000, "value"),
    ("model,metric,value", "v28,acc,1" + "x" * 100_000, "value"),
    ("model,metric,value,stderr", "v28,acc,0.5,-" + "1" * 100_000, "stderr"),
    ("model,metric,value,sha256", "v28,acc,0.5," + "f" * 100_000, "sha256"),
    ("model,metric,value,sub." + "k" * 100_000, "v28,acc,0.5,abc", "sub.kkkk"),
])
def test_a_huge_cell_or_header_is_echoed_shortened(ledger, tmp_path, header, row, field):
    """Issue 23 follow-up: a 100,000-digit value was one line of 100,121 characters (the whole number echoed)."""
    path = tmp_path / "huge.csv"
    path.write_text(f"{header}\n{row}\n")
    with pytest.raises(EvidenceError) as info:
        import_files(ledger, [path])
    text = str(info.value)
    assert "\n" not in text and len(text) < 600 and f"field '{field}" in text and "nothing was recorded" in text
    assert not ledger.path.exists()
