"""The evaluation ledger: records follow the weights, directions, plans, schema migrations, stored cells checked."""

from __future__ import annotations

import dataclasses
import re
import sqlite3

import pytest

from vecmerge.evidence import EvidenceError
from vecmerge.evidence.ledger.ledger import SCHEMA_VERSION, Entry, Ledger, is_stale

SHA_OLD, SHA_NEW = "a" * 64, "b" * 64


@pytest.fixture
def ledger(tmp_path) -> Ledger:
    return Ledger(tmp_path / "vecmerge-evidence.db")


def test_add_and_read_back(ledger):
    ids = ledger.add("v51", SHA_OLD, "official_total", [1.0180, 0.9895], note="two runs")
    ids += ledger.add("v51", SHA_OLD, "official_total", 1.0004, subs={"item_understanding": 0.2453})
    assert ids == [1, 2, 3]
    recs = ledger.records()
    assert [r.value for r in recs] == [1.0180, 0.9895, 1.0004]
    assert recs[0].note == "two runs" and recs[0].source == "manual" and recs[0].sha256 == SHA_OLD
    assert recs[2].sub_scores == {"item_understanding": 0.2453}
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", r.created) for r in recs)
    assert ledger.metrics() == ["official_total"] and ledger.models() == ["v51"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        recs[0].value = 2.0


def test_reading_a_missing_ledger_is_empty_and_creates_nothing(tmp_path):
    ledger = Ledger(tmp_path / "none.db")
    assert ledger.records() == [] and ledger.directions() == {} and ledger.metrics() == []
    assert not (tmp_path / "none.db").exists()


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf"), "1.0", True, None])
def test_non_finite_or_non_numbers_are_refused_and_nothing_is_written(ledger, bad):
    ledger.add("v28", SHA_OLD, "m", 0.5)
    with pytest.raises(EvidenceError, match=r"nothing recorded: .*'v28'.*value"):
        ledger.add("v28", SHA_OLD, "m", [0.9836, bad])  # the good first value must not be written either
    assert [r.value for r in ledger.records()] == [0.5]


def test_entry_problems_name_each_field():
    e = Entry(" v1", "", 0.5, sha256="abc", subs={"x": float("nan")}, stderr=-1.0, cluster="c")
    text = " | ".join(e.problems())
    for what in ("model", "metric", "sha256", "sub.x", "cluster", "stderr"):
        assert what in text, what


def test_sub_scores_one_mapping_per_value(ledger):
    ledger.add("v58", None, "official_total", [1.0234, 1.0145], subs=[{"item": 0.2453}, {"item": 0.2453}])
    assert [r.sub_scores for r in ledger.records()] == [{"item": 0.2453}] * 2
    with pytest.raises(EvidenceError, match="sub-scores given once for 2 values"):
        ledger.add("v58", None, "official_total", [1.0, 1.1], subs={"item": 0.2})
    with pytest.raises(EvidenceError, match="1 sub-score mappings for 2 values"):
        ledger.add("v58", None, "official_total", [1.0, 1.1], subs=[{"item": 0.2}])


def test_direction_declared_once(ledger):
    assert ledger.direction("official_total") is None
    ledger.set_direction("official_total", True)
    ledger.set_direction("official_total", True)  # the same declaration again is fine
    with pytest.raises(EvidenceError, match="already says higher is better"):
        ledger.set_direction("official_total", False)
    assert ledger.direction("official_total") is True
    ledger.set_direction("official_total", False, replace=True)
    assert ledger.directions() == {"official_total": False}
    with pytest.raises(EvidenceError, match="true or false"):
        ledger.set_direction("loss", "lower")


def test_a_conflicting_direction_in_a_write_writes_nothing(ledger):
    ledger.set_direction("toy/acc", True)
    with pytest.raises(EvidenceError, match="already says higher"):
        ledger.write([Entry("v51", "toy/acc", 0.5)], directions={"toy/acc": False})
    assert ledger.records() == []


def test_stale_records_follow_the_weights(ledger):
    """v51's name now points at new weights: its old records are stale and left out unless asked."""
    ledger.add("v51", SHA_OLD, "official_total", [1.0180, 0.9895])
    ledger.add("v51", SHA_NEW, "official_total", [0.9500])
    ledger.add("v51", None, "official_total", [0.9000])  # never hashed: cannot be tied to the new weights
    ledger.add("v28", SHA_OLD, "official_total", [0.9836])  # v28 not in the mapping: nothing to compare
    current = {"v51": SHA_NEW}
    assert [r.value for r in ledger.records(current_sha=current)] == [0.9500, 0.9836]
    every = ledger.records(current_sha=current, include_stale=True)
    assert [(r.value, r.stale) for r in every] == [(1.0180, True), (0.9895, True), (0.9500, False),
                                                   (0.9000, True), (0.9836, False)]
    assert len(ledger.records()) == 5  # with no current hashes nothing is stale
    assert not is_stale(every[0], {"v51": None})
    exported = ledger.export(current_sha=current)
    assert [row["stale"] for row in exported] == [True, True, False, True, False]


def test_filters_by_model_metric_and_level(ledger):
    ledger.add("v51", None, "a", [1.0])
    ledger.add("v28", None, "a", [2.0])
    ledger.add("v51", None, "b", [3.0])
    ledger.add_items("v51", None, "a", {"d1": 1.0, "d2": 0.0}, clusters={"d1": "t1", "d2": "t1"})
    assert [r.value for r in ledger.records(models=["v51"], metric="a")] == [1.0, 1.0, 0.0]
    assert [r.value for r in ledger.records(models=["v51"], metric="a", level="run")] == [1.0]
    items = ledger.records(level="item")
    assert [(r.item, r.cluster, r.is_item) for r in items] == [("d1", "t1", True), ("d2", "t1", True)]
    with pytest.raises(EvidenceError, match="level="):
        ledger.records(level="runs")


def test_export_rows_are_flat(ledger):
    ledger.add("v51", SHA_OLD, "m", 1.0, subs={"video": 0.3}, stderr=0.01, source="csv:x.csv")
    (row,) = ledger.export()
    assert row["sub.video"] == 0.3 and row["stderr"] == 0.01 and row["source"] == "csv:x.csv"
    assert set(row) >= {"id", "model", "sha256", "metric", "value", "item", "cluster", "note", "created", "stale"}


def test_schema_version_is_checked(tmp_path, ledger):
    ledger.add("v51", None, "m", 1.0)
    con = sqlite3.connect(ledger.path)
    assert con.execute("SELECT version FROM schema_version").fetchall() == [(SCHEMA_VERSION,)]
    con.execute("UPDATE schema_version SET version = ?", (SCHEMA_VERSION + 1,))
    con.commit()
    con.close()
    with pytest.raises(EvidenceError, match=f"schema version {SCHEMA_VERSION + 1}.*upgrade vecmerge"):
        ledger.records()
    other = tmp_path / "other.db"
    con = sqlite3.connect(other)
    con.execute("CREATE TABLE t (x)")
    con.commit()
    con.close()
    with pytest.raises(EvidenceError, match="not a vecmerge evidence ledger"):
        Ledger(other).records()
    with pytest.raises(EvidenceError, match="not a vecmerge evidence ledger"):
        Ledger(other).add("v51", None, "m", 1.0)  # never writes into someone else's database
    con = sqlite3.connect(other)
    assert con.execute("PRAGMA journal_mode").fetchone() == ("delete",)
    assert [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")] == ["t"]
    con.close()
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not sqlite at all" * 100)
    with pytest.raises(EvidenceError, match="junk.db"):
        Ledger(junk).records()


# -- schema versions and migration (version 1 -> 2: item sub-scores, plans) ---------------------------------
V1_SCHEMA = [  # the version-1 schema as vecmerge wrote it, copied here so the test does not share the code
    "CREATE TABLE schema_version (version INTEGER NOT NULL)",
    """CREATE TABLE records (id INTEGER PRIMARY KEY AUTOINCREMENT, model TEXT NOT NULL, sha256 TEXT,
       metric TEXT NOT NULL, value REAL NOT NULL, subs TEXT NOT NULL DEFAULT '{}', stderr REAL, item TEXT,
       cluster TEXT, source TEXT NOT NULL, note TEXT, created TEXT NOT NULL)""",
    "CREATE INDEX records_metric_model ON records (metric, model)",
    "CREATE TABLE directions (metric TEXT PRIMARY KEY, higher_is_better INTEGER NOT NULL, created TEXT NOT NULL)",
    "INSERT INTO schema_version (version) VALUES (1)",
]


def version_1_ledger(path):
    con = sqlite3.connect(path)
    for statement in V1_SCHEMA:
        con.execute(statement)
    con.execute("INSERT INTO records (model, sha256, metric, value, subs, source, created) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                ("v51", None, "official_total", 1.018, '{"item_understanding": 0.2453}', "manual",
                 "2026-01-01T00:00:00Z"))
    con.execute("INSERT INTO records (model, metric, value, item, cluster, source, created) VALUES "
                "('v51', 'official_total', 1.0, 'q1', 'c1', 'manual', '2026-01-01T00:00:00Z')")
    con.execute("INSERT INTO directions VALUES ('official_total', 1, '2026-01-01T00:00:00Z')")
    con.commit()
    con.close()
    return Ledger(path)


def test_an_old_ledger_is_read_as_it_is_and_migrated_by_the_first_write(tmp_path):
    ledger = version_1_ledger(tmp_path / "old.db")
    before = (tmp_path / "old.db").read_bytes()
    recs = ledger.records()
    assert [r.value for r in recs] == [1.018, 1.0] and recs[0].sub_scores == {"item_understanding": 0.2453}
    assert [r.subscore for r in recs] == [None, None] and ledger.plans() == [] and ledger.directions() == {
        "official_total": True}
    assert (tmp_path / "old.db").read_bytes() == before  # reading leaves the file alone
    ledger.add_items("v51", None, "official_total", {"q2": 1.0}, subscores={"q2": "video"})
    con = sqlite3.connect(tmp_path / "old.db")
    assert con.execute("SELECT version FROM schema_version").fetchall() == [(SCHEMA_VERSION,)]
    assert "subscore" in [r[1] for r in con.execute("PRAGMA table_info(records)")]
    con.close()
    recs = ledger.records()
    assert [(r.item, r.subscore) for r in recs] == [(None, None), ("q1", None), ("q2", "video")]
    assert recs[0].sub_scores == {"item_understanding": 0.2453} and recs[1].cluster == "c1"  # old records intact


def test_a_migration_that_fails_leaves_the_old_ledger_as_it_was(tmp_path, monkeypatch):
    from vecmerge.evidence.ledger import schema

    ledger = version_1_ledger(tmp_path / "old.db")
    monkeypatch.setitem(schema.MIGRATIONS, 1, [*schema.MIGRATIONS[1], "CREATE TABLE records (x)"])  # fails last
    with pytest.raises(EvidenceError, match="could not write"):
        ledger.add("v51", None, "official_total", 1.0)
    con = sqlite3.connect(tmp_path / "old.db")
    assert con.execute("SELECT version FROM schema_version").fetchall() == [(1,)]
    assert "subscore" not in [r[1] for r in con.execute("PRAGMA table_info(records)")]
    assert con.execute("SELECT COUNT(*) FROM records").fetchone() == (2,)


def test_item_records_name_their_sub_score(ledger):
    ledger.add_items("v58", SHA_OLD, "toy", {"s1": 1.0, "s2": 0.0}, clusters={"s1": "a"},
                     subscores={"s1": "start_low", "s2": "start_high"})
    assert [(r.item, r.cluster, r.subscore) for r in ledger.records()] == [
        ("s1", "a", "start_low"), ("s2", None, "start_high")]
    assert ledger.export()[0]["subscore"] == "start_low"
    with pytest.raises(EvidenceError, match="subscore: only item-level records"):
        ledger.write([Entry("v58", "toy", 0.5, subscore="start_low")])


def plan_of(**changes):
    from vecmerge.evidence.ledger.ledger import Plan

    fields = dict(id=0, a="v51", b="v28", metric="official_total", a_sha256=SHA_NEW, b_sha256=None,
                  min_effect=0.01, max_runs=10, alpha=0.05, higher_is_better=True, noise_sd=0.0096,
                  prior_scale=1.04, test="t-mixture")
    return Plan(**{**fields, **changes})


def test_plans_are_recorded_read_back_and_immutable(ledger):
    ledger.add("v51", SHA_NEW, "official_total", [1.0, 1.01])
    first = ledger.add_plan(plan_of())
    assert first.id == 1 and first.after_record == 2 and re.fullmatch(r"\d{4}-.*Z", first.created)
    ledger.add("v51", SHA_NEW, "official_total", 1.02)
    second = ledger.add_plan(plan_of(min_effect=0.02))
    assert ledger.plans() == [first, second] and second.after_record == 3
    assert ledger.plans("v51", "v28", "official_total")[-1].min_effect == 0.02 and ledger.plans(b="v99") == []
    con = sqlite3.connect(ledger.path)
    for sql in ("UPDATE plans SET min_effect = 0.5", "DELETE FROM plans"):
        with pytest.raises(sqlite3.DatabaseError, match="a plan is immutable"):
            con.execute(sql)
    con.close()
    assert ledger.plans() == [first, second]


def test_a_bad_plan_lists_every_problem(ledger):
    with pytest.raises(EvidenceError) as info:
        ledger.add_plan(plan_of(b="v51", min_effect=0.0, max_runs=1, alpha=1.5, a_sha256="xyz"))
    text = str(info.value)
    assert text.startswith("no plan recorded: 5 problem(s)") and "\n" not in text and text.endswith("and 2 more")
    for part in ("itself", "a_sha256", "min_effect"):
        assert part in text, part
    assert ledger.plans() == []


# -- version 2 -> 3: the eval environment of each record ---------------------------------------------------------
V2_SCHEMA = [*V1_SCHEMA,  # version 2 as vecmerge wrote it (copied, not imported): + subscore, + plans
             "ALTER TABLE records ADD COLUMN subscore TEXT",
             """CREATE TABLE plans (id INTEGER PRIMARY KEY AUTOINCREMENT, a TEXT NOT NULL, b TEXT NOT NULL,
                metric TEXT NOT NULL, a_sha256 TEXT, b_sha256 TEXT, min_effect REAL NOT NULL, max_runs INTEGER NOT NULL,
                alpha REAL NOT NULL, higher_is_better INTEGER NOT NULL, noise_sd REAL, prior_scale REAL NOT NULL,
                test TEXT NOT NULL, after_record INTEGER NOT NULL, created TEXT NOT NULL)""",
             "UPDATE schema_version SET version = 2"]


def test_the_migrations_are_ordered_one_version_at_a_time():
    from vecmerge.evidence.ledger import schema

    assert SCHEMA_VERSION == 4 and sorted(schema.MIGRATIONS) == list(range(1, SCHEMA_VERSION))
    assert schema.MIGRATIONS[2] == ["ALTER TABLE records ADD COLUMN env TEXT"]
    assert schema.MIGRATIONS[3] == ["ALTER TABLE plans ADD COLUMN design TEXT",
                                    "ALTER TABLE plans ADD COLUMN chain TEXT",
                                    "CREATE TABLE plan_chain_start AS SELECT COALESCE(MAX(id), 0) + 1 AS first_id "
                                    "FROM plans"]


def test_a_version_2_ledger_is_read_as_it_is_and_migrated_to_4_by_the_first_write(tmp_path):
    path = tmp_path / "v2.db"
    con = sqlite3.connect(path)
    for statement in V2_SCHEMA:
        con.execute(statement)
    con.execute("INSERT INTO records (model, metric, value, subs, source, created, item, subscore) VALUES "
                "('v51', 'toy', 1.0, '{}', 'manual', '2026-01-01T00:00:00Z', 'q1', 'video')")
    con.commit()
    con.close()
    before = path.read_bytes()
    ledger = Ledger(path)
    (old,) = ledger.records()
    assert (old.subscore, old.env, old.environment.id) == ("video", (), "44136fa355b3")  # no environment recorded
    assert path.read_bytes() == before
    ledger.add("v51", None, "toy", 0.5, env={"temperature": 0, "harness": "lm-eval"})
    con = sqlite3.connect(path)
    assert con.execute("SELECT version FROM schema_version").fetchall() == [(4,)]
    assert con.execute("SELECT env FROM records ORDER BY id").fetchall() == [
        (None,), ('{"harness":"lm-eval","temperature":"0"}',)]
    con.close()
    old_again, new = ledger.records()
    assert old_again == old and new.env == (("harness", "lm-eval"), ("temperature", "0"))


@pytest.mark.parametrize("stored, why", [("{not json", "not valid JSON"), ('["a"]', "not a JSON object of numbers"),
                                         ('{"x": "0.3"}', "not a JSON object of numbers"),
                                         ('{"x": NaN}', "NaN is not a JSON number"), (None, "not a JSON object")])
def test_a_record_whose_stored_sub_scores_are_malformed_is_one_error_naming_it(tmp_path, monkeypatch, run_cli,
                                                                              stored, why):
    """The ledger's own stored JSON is read through ``io.parse`` like a stranger's (the file may have been edited):
    a record whose sub-scores are not a JSON object of finite numbers is an EvidenceError naming the file and the
    record (id, model, metric), and one ``error:`` line with exit 2 in the CLI, not an internal error."""
    monkeypatch.chdir(tmp_path)
    ledger = Ledger(tmp_path / "vecmerge-evidence.db")
    ledger.add("v51", None, "official_total", [1.0180, 0.9895], subs=[{"x": 0.25}, {"x": 0.5}])
    con = sqlite3.connect(ledger.path)
    con.execute("UPDATE records SET subs = ? WHERE id = 2", (stored if stored is not None else 7,))
    con.commit()
    con.close()
    with pytest.raises(EvidenceError) as e:
        ledger.records()
    msg = str(e.value)
    assert msg.startswith(f"{ledger.path}: record 2 (v51, official_total): its stored sub-scores") and why in msg
    assert ledger.records(models=["v28"]) == []  # other records read as before
    res = run_cli("evidence", "show")
    assert res.exit_code == 2 and res.output.startswith("error: ") and len(res.output.strip().splitlines()) == 1
    assert "record 2 (v51, official_total)" in res.output and "Traceback" not in res.output
