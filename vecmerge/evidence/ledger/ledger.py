"""The evaluation ledger: one SQLite file of scores, each tied to the content sha256 of the weights it measured.

Evidence follows the weights, not the name. A record keeps the adapter's content hash at the time it was
recorded; when the caller passes the models' current hashes, records of other weights are *stale* and left
out unless asked for. Every write is one transaction (``connection.LedgerFile``).

    ledger = Ledger("vecmerge-evidence.db")
    ledger.set_direction("official_total", higher_is_better=True)
    ledger.add("v51", sha, "official_total", [1.0180, 0.9895, 1.0004, 1.0105, 1.0142],
               subs=[{"item_understanding": 0.2453}] * 5)
    current = ledger.records(metric="official_total", current_sha={"v51": sha})

It also keeps pre-registered plans (``add_plan``, ``plans``: immutable rows, see ``sequential.py``). The schema is
versioned (``schema.py``): an older ledger is read as it is and migrated by its first write.
"""

from __future__ import annotations

import dataclasses
import json
import numbers
import sqlite3
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path

from ...errors import few
from .. import EvidenceError
from . import plan_chain, schema, stored
from .connection import LedgerFile
from .environment import canonical_fields
from .records import SHA_RE, Entry, Plan, Record, finite_number, is_stale, name_problem, utc_now
from .schema import SCHEMA_VERSION

__all__ = ["Ledger", "Entry", "Record", "Plan", "is_stale", "finite_number", "utc_now", "SHA_RE", "SCHEMA_VERSION",
           "DEFAULT_NAME"]

DEFAULT_NAME = "vecmerge-evidence.db"


class Ledger(LedgerFile):
    """An evaluation ledger in one SQLite file (created on the first write; reads of a missing file are empty).

    Args:
        path (str | Path): the database file, ``vecmerge-evidence.db`` beside the workspace by default.
        timeout (float): seconds a writer waits for another writer's transaction to finish.
    """

    def __init__(self, path: str | Path = DEFAULT_NAME, timeout: float = 30.0):
        super().__init__(path, timeout)

    # -- writes ------------------------------------------------------------------------------------
    def write(self, entries: Iterable[Entry], directions: Mapping[str, bool] | None = None, *,
              also: Callable[[sqlite3.Connection, str], None] | None = None) -> list[int]:
        """Record every entry (and metric directions) in ONE transaction, or nothing at all.

        Args:
            entries (Iterable[Entry]): what to record; all are checked before anything is written.
            directions (Mapping[str, bool] | None): metric -> higher_is_better to declare alongside; a
                declaration that contradicts the ledger raises and nothing is written.
            also (Callable[[sqlite3.Connection, str], None] | None): more writes of the same transaction, called
                with the connection and the records' time (``pairs.write`` adds pair records this way).

        Returns:
            list[int]: the new records' ids, in the order given.
        """
        entries = list(entries)
        problems = [f"entry {i + 1} ({e.model!r}, {e.metric!r}): {p}"
                    for i, e in enumerate(entries) for p in e.problems()]
        if problems:
            raise EvidenceError(f"nothing recorded: {len(problems)} problem(s): {few(problems, 3)}")
        now = utc_now()

        def work(con: sqlite3.Connection) -> list[int]:
            for metric, higher in (directions or {}).items():
                self._declare(con, metric, higher, replace=False, now=now)
            ids: list[int] = []
            for e in entries:
                cur = con.execute(
                    "INSERT INTO records (model, sha256, metric, value, subs, stderr, item, cluster, source,"
                    " note, created, subscore, env) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (e.model, e.sha256, e.metric, float(e.value), json.dumps({k: float(v) for k, v in e.subs}),
                     None if e.stderr is None else float(e.stderr), e.item, e.cluster, e.source, e.note, now,
                     e.subscore, _env_json(e.env)))
                if cur.lastrowid is None:  # an INSERT always has one; the write fails as a database error would
                    raise sqlite3.DatabaseError("a record was inserted without a row id")
                ids.append(cur.lastrowid)
            if also is not None:
                also(con, now)
            return ids

        return self._write(work)

    def add(self, model: str, sha256: str | None, metric: str, values: float | Iterable[float], *,
            subs: Mapping[str, float] | Sequence[Mapping[str, float]] | None = None, stderr: float | None = None,
            source: str = "manual", note: str | None = None, env: Mapping | None = None) -> list[int]:
        """Record one or more whole-run scores of one model on one metric (one transaction).

        Args:
            values (float | Iterable[float]): one value per run.
            subs: sub-scores; one mapping for a single value, or a list of mappings, one per value.
            env (Mapping | None): the eval environment's fields, the same for every run (``environment.py``).

        Returns:
            list[int]: the new ids.
        """
        runs = [values] if isinstance(values, (float, int, numbers.Real)) else list(values)
        if not runs:
            raise EvidenceError(f"{model}: no value to record for {metric}")
        subs_list: list[Mapping[str, float]]
        if subs is None:
            subs_list = [{}] * len(runs)
        elif isinstance(subs, Mapping):
            if len(runs) != 1:
                raise EvidenceError(f"{model}: sub-scores given once for {len(runs)} values; "
                                    "record the runs one at a time, or give one mapping per value")
            subs_list = [subs]
        else:
            subs_list = list(subs)
            if len(subs_list) != len(runs):
                raise EvidenceError(f"{model}: {len(subs_list)} sub-score mappings for {len(runs)} values")
        fields = canonical_fields(env or {})
        pairs = [tuple(sorted(s.items())) if isinstance(s, Mapping) else s for s in subs_list]  # as Entry sorts them
        return self.write(Entry(model, metric, v, sha256, p, stderr=stderr, source=source, note=note, env=fields)
                          for v, p in zip(runs, pairs))

    def add_items(self, model: str, sha256: str | None, metric: str,
                  items: Mapping[str, float] | Iterable[tuple[str, float]], *,
                  clusters: Mapping[str, str] | None = None, subscores: Mapping[str, str] | None = None,
                  source: str = "manual", note: str | None = None) -> list[int]:
        """Record item-level scores (one per document) of one model on one metric (one transaction).

        Args:
            items: item id -> score, or (item id, score) pairs (an item may repeat: one per run).
            clusters (Mapping[str, str] | None): item id -> cluster key.
            subscores (Mapping[str, str] | None): item id -> the sub-score (task) the item counts toward.
        """
        pairs = list(items.items()) if isinstance(items, Mapping) else list(items)
        clusters, subscores = clusters or {}, subscores or {}
        return self.write(Entry(model, metric, v, sha256, item=str(i), cluster=clusters.get(str(i)),
                                source=source, note=note, subscore=subscores.get(str(i))) for i, v in pairs)

    def _declare(self, con: sqlite3.Connection, metric: str, higher: bool, *, replace: bool, now: str) -> None:
        if (p := name_problem(metric, "metric")) or not isinstance(higher, bool):
            raise EvidenceError(p or f"{metric}: higher_is_better must be true or false, not {higher!r}")
        row = con.execute("SELECT higher_is_better FROM directions WHERE metric = ?", (metric,)).fetchone()
        if row is not None and bool(row[0]) != higher and not replace:
            said = "higher" if row[0] else "lower"
            raise EvidenceError(f"{metric}: the ledger already says {said} is better; "
                                "replace the declaration explicitly to change it")
        con.execute("INSERT OR REPLACE INTO directions (metric, higher_is_better, created) VALUES (?, ?, ?)",
                    (metric, int(higher), now))

    def set_direction(self, metric: str, higher_is_better: bool, *, replace: bool = False) -> None:
        """Declare once per metric whether higher or lower is better (a conflicting second one raises)."""
        self._write(lambda con: self._declare(con, metric, higher_is_better, replace=replace, now=utc_now()))

    # -- reads -------------------------------------------------------------------------------------
    def direction(self, metric: str) -> bool | None:
        """True if higher is better, False if lower is, None if never declared."""
        return self.directions().get(metric)

    def directions(self) -> dict[str, bool]:
        """Every declared metric -> higher_is_better."""
        rows = self._read("SELECT metric, higher_is_better FROM directions ORDER BY metric")
        return dict(stored.direction_from_row(m, h, self.path) for m, h in rows)

    def records(self, models: Iterable[str] | None = None, metric: str | None = None, *,
                current_sha: Mapping[str, str | None] | None = None, include_stale: bool = False,
                level: str = "all") -> list[Record]:
        """Records in id order, filtered; stale ones (see ``is_stale``) left out unless ``include_stale``.

        Args:
            models (Iterable[str] | None): only these models (all when None).
            metric (str | None): only this metric.
            current_sha (Mapping[str, str | None] | None): each model's current content sha256.
            include_stale (bool): keep stale records (each carries ``stale=True``).
            level (str): ``"all"``, ``"run"`` (whole runs only) or ``"item"`` (item-level only).
        """
        if level not in ("all", "run", "item"):
            raise EvidenceError(f"level={level!r}: use all, run or item")
        sql, args = " FROM records WHERE 1=1", []
        if models is not None:
            models = list(models)
            sql += f" AND model IN ({', '.join('?' * len(models))})"
            args += models
        if metric is not None:
            sql += " AND metric = ?"
            args.append(metric)
        if level != "all":
            sql += " AND item IS NULL" if level == "run" else " AND item IS NOT NULL"
        out = []
        for row in self._read(lambda v: f"SELECT {schema.record_select(v)}{sql} ORDER BY id", args):
            rec = stored.record_from_row(row, self.path)
            stale = is_stale(rec, current_sha)
            if stale and not include_stale:
                continue
            out.append(dataclasses.replace(rec, stale=True) if stale else rec)
        return out

    def iter_records(self, current_sha: Mapping[str, str | None] | None = None, *,
                     batch: int = 10_000) -> Iterator[Record]:
        """Every record in id order (stale ones included, flagged), read ``batch`` rows at a time: a whole ledger
        streamed without holding it (``export``). Each row is checked as ``records`` checks it."""
        if not self.path.exists():
            return
        con = self._connect(write=False)
        try:
            if not schema.tables(con):
                return
            cur = con.execute(f"SELECT {schema.record_select(self._check_version(con))} FROM records ORDER BY id")
            while rows := cur.fetchmany(batch):
                for row in rows:
                    rec = stored.record_from_row(row, self.path)
                    yield dataclasses.replace(rec, stale=True) if is_stale(rec, current_sha) else rec
        except sqlite3.Error as err:
            raise EvidenceError(f"{self.path}: could not read the evidence ledger ({err})") from err
        finally:
            con.close()

    def export_columns(self) -> tuple[list[str], list[str], bool]:
        """What an export's columns depend on, from the distinct stored cells (one pass in SQLite): the sub-score
        keys, the environment keys (both sorted) and whether any record names its sub-score."""
        keys: dict[str, list[str]] = {}
        for column, least in (("subs", 1), ("env", 3)):
            def distinct(v: int, c: str = column, n: int = least) -> str | None:
                return None if v < n else f"SELECT DISTINCT {c} FROM records"

            cells = self._read(distinct)
            try:
                keys[column] = sorted({k for (t,) in cells if t is not None
                                       for k, _ in stored.stored_pairs(self.path, column, t)})
            except EvidenceError:
                for _ in self.iter_records():  # the first bad row raises, naming its record as every read does
                    pass
                raise
        named = self._read(lambda v: None if v < 2 else
                           "SELECT 1 FROM records WHERE subscore IS NOT NULL AND subscore != '' LIMIT 1")
        return keys["subs"], keys["env"], bool(named)

    def metrics(self) -> list[str]:
        """Every metric with at least one record, sorted."""
        return [r[0] for r in self._read("SELECT DISTINCT metric FROM records ORDER BY metric")]

    def models(self) -> list[str]:
        """Every model with at least one record, sorted."""
        return [r[0] for r in self._read("SELECT DISTINCT model FROM records ORDER BY model")]

    def export(self, current_sha: Mapping[str, str | None] | None = None) -> list[dict]:
        """Every record (stale ones included, flagged) as flat JSON-ready dicts (see ``Record.to_dict``)."""
        return [r.to_dict() for r in self.records(current_sha=current_sha, include_stale=True)]

    # -- plans -------------------------------------------------------------------------------------
    def add_plan(self, plan: Plan) -> Plan:
        """Record a pre-registered plan (one transaction); its ``id``, ``after_record`` (the largest record id
        now: later records are its looks) and ``created`` are set here. A plan is never changed: the database
        refuses UPDATE and DELETE on it; a new plan is a new record.

        Args:
            plan (Plan): the plan (its id, after_record and created are ignored).

        Returns:
            Plan: as recorded.
        """
        problems = plan.problems()
        if problems:
            raise EvidenceError(f"no plan recorded: {len(problems)} problem(s): {few(problems, 3)}")
        now = utc_now()

        def work(con: sqlite3.Connection) -> list[Plan]:
            last = con.execute("SELECT COALESCE(MAX(id), 0) FROM records").fetchone()[0]
            rows = con.execute(f"SELECT {schema.PLAN_COLUMNS} FROM plans ORDER BY id").fetchall()
            seq = con.execute("SELECT seq FROM sqlite_sequence WHERE name = 'plans'").fetchone()
            new_id = max([seq[0] if seq else 0] + [r[0] for r in rows]) + 1
            design = None if plan.design is None else json.dumps(plan.design, sort_keys=True, ensure_ascii=True,
                                                                   separators=(",", ":"))
            rec = dataclasses.replace(plan, id=new_id, after_record=int(last), created=now,
                                      min_effect=float(plan.min_effect), alpha=float(plan.alpha),
                                      prior_scale=float(plan.prior_scale), chain=None)
            cells = [int(v) if isinstance(v, bool) else v for v in (getattr(rec, f.name) for f in
                                                                     dataclasses.fields(Plan))]
            cells[-2] = design
            chain = plan_chain.link(plan_chain.check_chain(rows, self.path, plan_chain.first_chained(con)),
                                    cells[:-1])
            cells[-1] = chain
            con.execute(f"INSERT INTO plans ({schema.PLAN_COLUMNS}) VALUES ({', '.join('?' * len(cells))})", cells)
            return [dataclasses.replace(rec, chain=chain)]

        return self._write(work)[0]

    def plans(self, a: str | None = None, b: str | None = None, metric: str | None = None) -> list[Plan]:
        """Recorded plans in id order (oldest first), filtered by A, B and metric where given."""
        rows = self._read(lambda v: None if v < 2 else f"SELECT {schema.plan_select(v)} FROM plans ORDER BY id")
        held = self._read("SELECT name FROM sqlite_master WHERE name = 'plan_chain_start'") if rows else []
        anchor = (self._read(plan_chain.FIRST_CHAINED) or [(None,)])[0][0] if held else None
        plans = [stored.plan_from_row(row, self.path) for row in rows]  # every plan: an edit anywhere is seen
        plan_chain.check_chain(rows, self.path, anchor if isinstance(anchor, int) else None)
        return [p for p in plans if (a is None or p.a == a) and (b is None or p.b == b)
                and (metric is None or p.metric == metric)]


def _env_json(fields: Iterable[tuple[str, str]]) -> str | None:
    """The environment column: canonical JSON of the fields, NULL for none recorded."""
    return json.dumps(dict(fields), sort_keys=True, separators=(",", ":"), ensure_ascii=True) if fields else None
