"""Item-level records counted in SQL: what ``evidence show`` reports of them, without a Record per row.

An item-level ledger holds one record per document per run (a million rows for 20 models), and ``show``
reports only counts of them: per (model, metric) the records and distinct items, per eval environment the
records, models and metrics, and which are stale. ``item_groups`` reads them as one GROUP BY over
(model, metric, sha256, env). The cells it reports from are checked as ``stored.record_from_row`` checks
them: each group's first row (its model, metric, sha256 and env: every row of the group holds the same) and
each distinct ``subs`` text go through it, and one SQL pass finds the first row whose other cells have a type
the ledger never writes or a number that is not finite (``_SUSPECT``), read as a Record to be refused naming
it. The texts of items, clusters, sources and notes are not shown here (compare and export check them).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from . import schema, stored
from .environment import Environment


def _bad_real(col: str, optional: bool) -> str:
    test = f"(typeof({col}) != 'real' OR abs({col}) = 9e999{' OR ' + col + ' < 0' if optional else ''})"
    return f"({col} IS NOT NULL AND {test})" if optional else test


_SUSPECT = " OR ".join([
    "typeof(id) != 'integer'", "typeof(item) != 'text'", "typeof(source) != 'text'", "typeof(created) != 'text'",
    _bad_real("value", False), _bad_real("stderr", True), "(note IS NOT NULL AND typeof(note) != 'text')",
    "(cluster IS NOT NULL AND typeof(cluster) != 'text')", "(subscore IS NOT NULL AND typeof(subscore) != 'text')"])


@dataclass(frozen=True)
class ItemGroup:
    """The item-level records of one (model, metric, sha256, env): ``first`` (smallest id: the group's place in
    record order), ``records`` and ``items`` (how many, and how many distinct items), ``stale`` (they measured other
    weights than the model's now)."""

    first: int
    model: str
    metric: str
    sha256: str | None
    env: tuple[tuple[str, str], ...]
    records: int
    items: int
    stale: bool = False

    @property
    def id(self) -> int:
        """The group's place in record order (its first record's id)."""
        return self.first

    @property
    def environment(self) -> Environment:
        return Environment(self.env)


def _reader(ledger, args: dict):
    def read(sql: str) -> list[tuple]:
        def of_version(v: int) -> str:
            has = v >= schema.ADDED["env"]  # an older ledger has no env column: every env reads as NULL
            return (sql.replace("{cols}", schema.record_select(v)).replace("{env}", "env" if has else "NULL")
                    .replace("{same_env}", "f.env IS r.env" if has else "1"))

        return ledger._read(of_version, args)

    return read


def item_groups(ledger, models: Iterable[str] | None = None, metric: str | None = None, *,
                current_sha: Mapping[str, str | None] | None = None) -> list[ItemGroup]:
    """Every item-level record of ``models`` (all when None) and ``metric`` (all when None), grouped by model,
    metric, sha256 and env, in order of each group's first record; every cell checked (module docstring).

    Args:
        ledger (Ledger): the ledger. current_sha (Mapping[str, str | None] | None): ``records.is_stale``'s rule.
    """
    where, args = " WHERE item IS NOT NULL", {}
    if models is not None:
        names = list(models)
        where += f" AND model IN ({', '.join(f':m{i}' for i in range(len(names)))})"
        args.update({f"m{i}": n for i, n in enumerate(names)})
    if metric is not None:
        where += " AND metric = :metric"
        args["metric"] = metric
    read = _reader(ledger, args)
    for row in read(f"SELECT {{cols}} FROM records{where} AND ({_SUSPECT}) ORDER BY id LIMIT 1"):
        stored.record_from_row(row, ledger.path)  # refused there, naming the record and the cell
    for row in read(f"SELECT {{cols}} FROM records WHERE id IN (SELECT min(id) FROM records{where} AND subs IS NOT "
                    "'{}' GROUP BY subs)"):  # '{}', no sub-scores, is what an item-level record nearly always holds
        stored.record_from_row(row, ledger.path)  # every other distinct sub-score text, parsed
    groups = read(f"SELECT min(id), count(*), count(DISTINCT item) FROM records{where} GROUP BY model, metric, "
                  "sha256, {env} ORDER BY min(id)")
    ids = ", ".join(str(int(g[0])) for g in groups)
    firsts = {row[0]: stored.record_from_row(row, ledger.path)
              for row in (read(f"SELECT {{cols}} FROM records WHERE id IN ({ids})") if groups else [])}
    out = []
    for first, n, items in groups:
        r = firsts[first]
        now = (current_sha or {}).get(r.model)
        out.append(ItemGroup(first, r.model, r.metric, r.sha256, r.env, n, items, now is not None and r.sha256 != now))
    return out


def distinct_items(ledger, groups: list[ItemGroup]) -> int:
    """How many distinct items ``groups`` (of one model and metric) hold together: one group's own count, or one
    SQL count over the records that share a group's sha256 and env (``IS``: NULL matches NULL)."""
    if len(groups) <= 1:
        return groups[0].items if groups else 0
    firsts = ", ".join(str(int(g.first)) for g in groups)
    read = _reader(ledger, {"model": groups[0].model, "metric": groups[0].metric})
    rows = read("SELECT count(DISTINCT r.item) FROM records r WHERE r.item IS NOT NULL AND r.model = :model AND "
                f"r.metric = :metric AND EXISTS (SELECT 1 FROM records f WHERE f.id IN ({firsts}) AND f.sha256 IS "
                "r.sha256 AND {same_env})")
    return int(rows[0][0]) if rows else 0
