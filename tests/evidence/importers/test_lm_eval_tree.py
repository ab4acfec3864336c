"""An lm-eval output tree (``tests/lm_eval_layout.py``): one command imports it, every samples file with its own
run, a group's items are its subtasks' items, a single run per model gets a paired test (McNemar, against
scipy), the same file imported twice counts once, and a group shares one environment with its subtasks."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from lm_eval_layout import DOCS, TASKS, flipped_pair, scores, write_run
from scipy import stats

from vecmerge.evidence.importers.importers import import_files
from vecmerge.evidence.importers.lm_eval_groups import leaves
from vecmerge.evidence.importers.lm_eval_tree import match_samples
from vecmerge.evidence.judge.compare import compare_records
from vecmerge.evidence.judge.subscores import compare_subscores
from vecmerge.evidence.ledger.ledger import Ledger

STAMP_1, STAMP_2 = "2026-12-01T10-00-00.000001", "2026-12-02T09-30-00.000002"


@pytest.fixture
def tree(tmp_path):
    v54, v60 = flipped_pair()
    out = tmp_path / "out"
    write_run(out, "v54", STAMP_1, v54)
    write_run(out, "v54", STAMP_2, scores(11, 0.8), seed=1)  # a second run of v54 in the same folder
    write_run(out / "nested" / "deeper", "v60", STAMP_1, v60)
    return out, v54, v60


def test_group_compare_pairs_its_subtasks_items_against_scipy(tmp_path, tree):
    """The finding: `compare v54 v60 --metric facts/acc` (a group) said "no item-level records for both"."""
    out, v54, v60 = tree
    ledger = Ledger(tmp_path / "ev.db")
    import_files(ledger, [out / "v54" / f"results_{STAMP_1}.json", *sorted((out / "v54").glob(f"*{STAMP_1}.jsonl")),
                          *sorted((out / "nested").rglob("*"))])
    c = compare_records("v54", "v60", ledger.records(metric="facts/acc"), metric="facts/acc", higher_is_better=True)
    a = [x for t in TASKS for x in v54[t]]
    b = [x for t in TASKS for x in v60[t]]
    assert len(a) == 3 * DOCS == 120 and c.paired.n == (120,)
    assert not any("no item-level records" in r for r in c.reasons)
    n10 = sum(x == 1 and y == 0 for x, y in zip(a, b))
    n01 = sum(x == 0 and y == 1 for x, y in zip(a, b))
    assert n10 + n01 >= 25 and c.paired.method == "McNemar chi-square" and c.paired.discordant == (n10, n01)
    assert c.paired.p == pytest.approx(stats.chi2.sf((abs(n10 - n01) - 1) ** 2 / (n10 + n01), 1), rel=1e-12)
    # the chi-square is the large-sample form of the exact test: both agree on the side of 0.05 here
    assert (c.paired.p < 0.05) == (stats.binomtest(n10, n10 + n01, 0.5).pvalue < 0.05)
    ref = stats.ttest_rel(a, b)
    assert c.paired.diff == pytest.approx(np.mean(a) - np.mean(b), abs=1e-15)
    assert (c.paired.ci_low, c.paired.ci_high) == pytest.approx(tuple(ref.confidence_interval(0.95)), rel=1e-10)
    assert c.decided_by == "paired" and c.verdict_code == ("a_better" if c.paired.p < 0.05 else "within_noise")
    # a single run each: lm-eval's own stderr of the group is kept beside vecmerge's (which has none)
    assert c.a_summary.n == 1 and c.a_summary.se is None
    assert c.a_summary.harness_se == pytest.approx(np.std(a, ddof=1) / np.sqrt(120), rel=1e-12)
    # every subtask pairs its own 40 documents: few discordant ones -> the exact binomial
    subs = compare_subscores("v54", "v60", ledger.records(metric="facts/acc"), metric="facts/acc",
                             higher_is_better=True)
    for t in TASKS:
        row = subs.row(t)
        d10 = sum(x == 1 and y == 0 for x, y in zip(v54[t], v60[t]))
        d01 = sum(x == 0 and y == 1 for x, y in zip(v54[t], v60[t]))
        assert row.test.n == (DOCS,) and row.test.discordant == (d10, d01) and d10 + d01 < 25
        assert row.p == pytest.approx(stats.binomtest(d10, d10 + d01, 0.5).pvalue, rel=1e-12)


def test_tree_imports_in_one_command_each_samples_file_with_its_run(tmp_path, tree):
    """Item 3: a folder of many runs, in any order, nested; two runs of v54 in one folder told apart by stamp."""
    out, v54, _ = tree
    ledger = Ledger(tmp_path / "ev.db")
    res = import_files(ledger, [out])
    assert res["models"] == ["v54", "v60"] and res["duplicates"] == []
    runs = ledger.records(["v54"], "facts/acc", level="run")
    assert [r.value for r in runs] == pytest.approx([np.mean([x for t in TASKS for x in v54[t]]),
                                                     np.mean([x for t in TASKS for x in scores(11, 0.8)[t]])])
    items = ledger.records(["v54"], "facts_place/acc", level="item")
    assert len(items) == 2 * DOCS  # both runs' documents, each from its own samples file
    by_source: dict[str, list[float]] = {}
    for r in items:
        by_source.setdefault(r.source.split("@")[0], []).append(r.value)
    assert by_source[f"lm-eval:{out / 'v54' / f'samples_facts_place_{STAMP_1}.jsonl'}"] == v54["facts_place"]
    # the samples listed apart from (and before) their results files, with two models: matched, not refused
    files = sorted(out.rglob("samples_*.jsonl")) + sorted(out.rglob("results_*.json"))[::-1]
    other = Ledger(tmp_path / "other.db")
    assert import_files(other, files)["records"] == res["records"]
    assert {(r.model, r.metric, r.item, r.value) for r in other.records()} == {
        (r.model, r.metric, r.item, r.value) for r in ledger.records()}


def test_match_samples_by_folder_and_stamp(tmp_path, tree):
    out, _, _ = tree
    results = sorted(out.rglob("results_*.json"))
    samples = sorted(out.rglob("samples_*.jsonl"))
    got = match_samples(results, samples)
    assert all(got[s].parent == s.parent and got[s].name.endswith(s.name[-len(STAMP_1) - 6:].replace(
        ".jsonl", ".json")) for s in samples)


def test_same_results_file_imported_twice_is_counted_once(tmp_path, tree):
    """Item 7: by content hash: a second import of the tree, or a copy of a run elsewhere in it, adds nothing."""
    out, _, _ = tree
    ledger = Ledger(tmp_path / "ev.db")
    first = import_files(ledger, [out])
    again = import_files(ledger, [out])
    assert again["records"] == 0 and len(again["duplicates"]) == len(list(out.rglob("*.json*")))
    assert all("in the ledger already" in d["same_as"] for d in again["duplicates"])
    assert len(ledger.records()) == first["records"]
    copy = tmp_path / "copy"
    shutil.copytree(out / "nested", copy / "nested")
    fresh = Ledger(tmp_path / "fresh.db")
    res = import_files(fresh, [out, copy])
    assert res["records"] == first["records"] and len(res["duplicates"]) == 4  # results + 3 samples of v60
    assert {d["file"].split("/copy/")[0] for d in res["duplicates"]} == {str(tmp_path)}


def test_group_and_its_subtasks_share_one_environment(tmp_path, tree):
    """Item 7: facts and facts_place/time/who carry one environment id (task fields combined per task)."""
    out, _, _ = tree
    ledger = Ledger(tmp_path / "ev.db")
    import_files(ledger, [out / "v54" / f"results_{STAMP_1}.json"])
    recs = ledger.records()
    assert {r.metric.split("/")[0] for r in recs} == {"facts", *TASKS}
    assert len({r.environment.id for r in recs}) == 1
    fields = dict(recs[0].env)
    assert fields["n_shot"] == "0" and fields["task_hash"].startswith("{") and '"facts_who"' in fields["task_hash"]
    assert leaves("facts", {"facts": ["sub", "facts_who"], "sub": ["facts_place", "facts"]}) == [
        "facts_place", "facts_who"]  # nested groups followed, a cycle cut
