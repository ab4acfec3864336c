"""The ledger's SQLite schema, its version, and the migrations that bring an older ledger up to date.

    version 1   records (whole runs with their sub-scores as JSON, item-level records), directions
    version 2   + records.subscore (the sub-score an item-level record counts toward)
                + plans (pre-registered sequential comparisons), immutable: triggers refuse UPDATE and DELETE
    version 3   + records.env (the eval environment's fields as canonical JSON, ``environment.py``; NULL: none
                recorded, the empty environment)
    version 4   + plans.design (planned looks: the design and its stated power, JSON) and plans.chain (the
                integrity record, ``plan_chain.py``; NULL for plans recorded before)

A ledger of an older version is READ as it is (a missing column reads as NULL, a missing table as empty) and
migrated, inside the first write's own transaction, one version at a time (``MIGRATIONS[v]`` takes version v
to v + 1). A ledger newer than this vecmerge is refused with "upgrade vecmerge". Statements are listed one by
one, never run through ``executescript`` (it COMMITs) nor split on ``;`` (a trigger's body holds one).
"""

from __future__ import annotations

import sqlite3

SCHEMA_VERSION = 4

_RECORDS_V1 = """CREATE TABLE IF NOT EXISTS records (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    model TEXT NOT NULL,
    sha256 TEXT,
    metric TEXT NOT NULL,
    value REAL NOT NULL,
    subs TEXT NOT NULL DEFAULT '{}',
    stderr REAL,
    item TEXT,
    cluster TEXT,
    source TEXT NOT NULL,
    note TEXT,
    created TEXT NOT NULL
)"""
_PLANS = """CREATE TABLE IF NOT EXISTS plans (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    a TEXT NOT NULL,
    b TEXT NOT NULL,
    metric TEXT NOT NULL,
    a_sha256 TEXT,
    b_sha256 TEXT,
    min_effect REAL NOT NULL,
    max_runs INTEGER NOT NULL,
    alpha REAL NOT NULL,
    higher_is_better INTEGER NOT NULL,
    noise_sd REAL,
    prior_scale REAL NOT NULL,
    test TEXT NOT NULL,
    after_record INTEGER NOT NULL,
    created TEXT NOT NULL
)"""
_IMMUTABLE = [f"""CREATE TRIGGER IF NOT EXISTS plans_no_{verb.lower()} BEFORE {verb} ON plans
BEGIN SELECT RAISE(ABORT, 'a plan is immutable: record a new plan instead'); END""" for verb in ("UPDATE", "DELETE")]

CREATE_V1 = [
    "CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)",
    _RECORDS_V1,
    "CREATE INDEX IF NOT EXISTS records_metric_model ON records (metric, model)",
    """CREATE TABLE IF NOT EXISTS directions (
    metric TEXT PRIMARY KEY,
    higher_is_better INTEGER NOT NULL,
    created TEXT NOT NULL
)""",
]
MIGRATIONS: dict[int, list[str]] = {
    1: ["ALTER TABLE records ADD COLUMN subscore TEXT", _PLANS, *_IMMUTABLE],
    2: ["ALTER TABLE records ADD COLUMN env TEXT"],
    3: ["ALTER TABLE plans ADD COLUMN design TEXT", "ALTER TABLE plans ADD COLUMN chain TEXT",
        # every plan from this id on carries its chain: an unchained plan past it is an edit (plan_chain.py)
        "CREATE TABLE plan_chain_start AS SELECT COALESCE(MAX(id), 0) + 1 AS first_id FROM plans"],
}

# what reads filter on, beside CREATE_V1's (metric, model): a model's records on every metric (show NAME, compare's
# stale counts, ls). Indexes change no row and no version: every write adds a missing one (``index``).
# the filters of the reads: a model's records; and whole runs only (partial indexes: an item-level ledger's runs are
# a few rows among millions, read by compare's pooled noise and show's summaries without touching the items)
INDEXES = ["CREATE INDEX IF NOT EXISTS records_model_metric ON records (model, metric)",
           "CREATE INDEX IF NOT EXISTS records_runs ON records (id) WHERE item IS NULL",
           "CREATE INDEX IF NOT EXISTS records_runs_metric ON records (metric, model) WHERE item IS NULL",
           "CREATE INDEX IF NOT EXISTS records_runs_model ON records (model, metric) WHERE item IS NULL"]

RECORD_COLUMNS = ("id, model, sha256, metric, value, subs, stderr, item, cluster, source, note, created, subscore, "
                  "env")
ADDED = {"subscore": 2, "env": 3}  # a record column -> the version that added it
PLAN_COLUMNS = ("id, a, b, metric, a_sha256, b_sha256, min_effect, max_runs, alpha, higher_is_better, noise_sd, "
                "prior_scale, test, after_record, created, design, chain")
PLAN_ADDED = {"design": 4, "chain": 4}


def tables(con: sqlite3.Connection) -> set[str]:
    """The names of the database's tables."""
    return {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


def create(con: sqlite3.Connection) -> None:
    """Create a ledger of the current version in an empty database (inside the caller's transaction)."""
    for statement in CREATE_V1:
        con.execute(statement)
    con.execute("INSERT INTO schema_version (version) VALUES (1)")
    migrate(con, 1)


def migrate(con: sqlite3.Connection, found: int) -> int:
    """Bring a ledger of version ``found`` to ``SCHEMA_VERSION`` (inside the caller's transaction).

    Returns:
        int: the version before (``found``); every step's statements ran and the version row was updated.
    """
    for version in range(found, SCHEMA_VERSION):
        for statement in MIGRATIONS[version]:
            con.execute(statement)
    if found < SCHEMA_VERSION:
        con.execute("UPDATE schema_version SET version = ?", (SCHEMA_VERSION,))
    return found


def index(con: sqlite3.Connection) -> None:
    """Add the ``INDEXES`` a ledger lacks (inside the caller's transaction; an older ledger gets them at its first
    write, and reads it without them until then)."""
    for statement in INDEXES:
        con.execute(statement)


def record_select(version: int) -> str:
    """The column list that reads ``RECORD_COLUMNS`` from a ledger of ``version`` (a column added later reads as
    NULL: ``ADDED``)."""
    return ", ".join(f"NULL AS {c}" if ADDED.get(c, 1) > version else c for c in RECORD_COLUMNS.split(", "))


def plan_select(version: int) -> str:
    """The column list that reads ``PLAN_COLUMNS`` from a ledger of ``version`` (``PLAN_ADDED``: NULL before)."""
    return ", ".join(f"NULL AS {c}" if PLAN_ADDED.get(c, 2) > version else c for c in PLAN_COLUMNS.split(", "))
