"""Item-level records counted in SQL (``item_groups``): ``evidence show``'s counts equal those of a Record per row, and
a hostile item-level cell is refused naming its record, as a Record read refuses it (issue 36: show on 1e6 records)."""

from __future__ import annotations

import sqlite3

import pytest

from vecmerge.commands.judging import compare_models
from vecmerge.commands.recording import export_lines
from vecmerge.commands.summaries import show
from vecmerge.evidence import EvidenceError
from vecmerge.evidence.judge.compare import compare_records
from vecmerge.evidence.ledger.environment import EnvChoice, records_of_one_environment
from vecmerge.evidence.ledger.ledger import Entry, Ledger

M, SHA_A, SHA_OLD, SHA_B = "probe:loglik", "a" * 64, "0" * 64, "b" * 64


@pytest.fixture
def ledger(tmp_path) -> Ledger:
    """a: items q0..q5 (h1), q20 (h2) and under an old sha256 (stale) q3..q8 (h1); b: q0..q5 (h1); runs."""
    led = Ledger(tmp_path / "l.db")
    led.set_direction(M, True)
    entries = [Entry("a", M, 0.1 * i, SHA_A, item=f"q{i}", cluster=f"c{i % 2}", env={"harness": "h1"})
               for i in range(6)]
    entries += [Entry("a", M, 0.2 * i, SHA_OLD, item=f"q{i}", env={"harness": "h1"}) for i in range(3, 9)]
    entries += [Entry("a", M, 0.3, SHA_A, item="q20", env={"harness": "h2"})]
    entries += [Entry("b", M, 0.05 * i, SHA_B, item=f"q{i}", cluster=f"c{i % 2}", env={"harness": "h1"})
                for i in range(6)]
    entries += [Entry(m, M, v, s, env={"harness": "h1"}) for m, s in (("a", SHA_A), ("b", SHA_B)) for v in (1.0, 2.0)]
    entries += [Entry("a", M, 0.4 * i, SHA_A, item=f"q{i}", env={"harness": "h1"}) for i in range(2)]  # repeats
    led.write(entries)
    return led


def _reference(ledger: Ledger, names, current, include_stale: bool, choice: EnvChoice) -> dict:
    """show's counts from a Record per row (the code before issue 36's change, written out)."""
    every = [r for r in ledger.records(names, M, current_sha=current, include_stale=True)
             if choice.matches(r.environment)]
    used = [r for r in every if include_stale or not r.stale]
    stale, items, envs = {}, {}, {}
    for r in every:
        if r.stale:
            stale.setdefault((r.model, r.metric), []).append(r.sha256)
    for r in used:
        if r.is_item:
            items.setdefault((r.model, r.metric), []).append(r.item)
        envs.setdefault(r.environment.id, (r.environment, []))[1].append(r)
    return {"stale": [{"model": m, "metric": k, "records": len(v), "sha256s": sorted({s or "" for s in v})}
                      for (m, k), v in stale.items()],
            "item_level": [{"model": m, "metric": k, "items": len(set(v)), "records": len(v)}
                           for (m, k), v in items.items()],
            "environments": [{**e.to_dict(), "records": len(rs), "models": sorted({r.model for r in rs}),
                              "metrics": sorted({r.metric for r in rs})} for e, rs in envs.values()]}


@pytest.mark.parametrize("names", [None, ["a"], ["b", "a"]])
@pytest.mark.parametrize("include_stale", [False, True])
@pytest.mark.parametrize("env", [None, "harness=h1"])
def test_show_counts_item_level_records_as_a_record_per_row_does(ledger, names, include_stale, env):
    current = {"a": SHA_A, "b": SHA_B}
    choice = EnvChoice.parse([env]) if env else EnvChoice()
    out = show(ledger, names, M, current_sha=current, include_stale=include_stale, env=choice)
    want = _reference(ledger, names, current, include_stale, choice)
    assert {k: out[k] for k in want} == want
    if names is None and include_stale:  # a's items: q0..q8 (and q20 in h2) over several groups
        assert {"model": "a", "metric": M, "items": 9 if env else 10, "records": 14 if env else 15} in out[
            "item_level"]


def test_compare_reads_the_other_models_runs_only_and_gives_the_same_result(ledger):
    """compare reads A's and B's records and the other models' whole runs (their items enter no statistic)."""
    ledger.write([Entry("c", M, 0.5, "c" * 64, item=f"q{i}", env={"harness": "h1"}) for i in range(6)]
                 + [Entry("c", M, v, "c" * 64, env={"harness": "h1"}) for v in (1.5, 1.7)])
    current = {"a": SHA_A, "b": SHA_B, "c": "c" * 64}
    choice = EnvChoice.parse(["harness=h1"])
    out = compare_models(ledger, "a", "b", M, current_sha=current, env=choice)
    _, recs = records_of_one_environment(ledger.records(metric=M, current_sha=current), {"a", "b"}, choice, "x")
    want = compare_records("a", "b", recs, metric=M, higher_is_better=True, env=out["env"]).to_dict()
    assert out == want
    assert out["paired"] is not None  # the item-level test ran on a's and b's items


@pytest.mark.parametrize("sql, match", [
    ("UPDATE records SET value = 'abc' WHERE id = 3", "record 3 (a, probe:loglik): value 'abc' is not a"),
    ("UPDATE records SET item = X'7131' WHERE id = 4", "record 4 (a, probe:loglik): item b'q1' is not a name"),
    ("UPDATE records SET cluster = X'1b5b324a' WHERE id = 5", "record 5 (a, probe:loglik): cluster"),
    ("UPDATE records SET sha256 = 'xyz' WHERE id = 6", "record 6 (a, probe:loglik): sha256 'xyz' is not 64"),
    ("UPDATE records SET subs = '{oops' WHERE id = 7", "record 7 (a, probe:loglik): its stored sub-scores"),
    ("UPDATE records SET env = '[' WHERE id = 8", "record 8 (a, probe:loglik): env '[' is not valid JSON"),
    ("UPDATE records SET stderr = -1.0 WHERE id = 9", "record 9 (a, probe:loglik): stderr -1.0 is not a finite"),
])
def test_a_hostile_item_level_cell_is_refused_naming_its_record(ledger, sql, match):
    con = sqlite3.connect(ledger.path)
    con.execute(sql)
    con.commit()
    con.close()
    with pytest.raises(EvidenceError, match=match.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        show(ledger)


def test_an_item_text_show_does_not_print_is_left_to_the_readers_that_do(ledger):
    """show prints no item, cluster or source text: a bad one (edge space, escape) is refused by export and compare,
    which do; show still counts the record."""
    con = sqlite3.connect(ledger.path)
    con.execute("UPDATE records SET item = 'q1 ' WHERE id = 4")
    con.commit()
    con.close()
    assert sum(r["records"] for r in show(ledger, ["a"], M)["item_level"]) == 15
    with pytest.raises(EvidenceError, match=r"record 4 \(a, probe:loglik\): item 'q1 ' is not a name"):
        "".join(export_lines(ledger))
