"""The ledger's rows read back, every cell checked: a ledger changed outside vecmerge is refused naming the record.

SQLite keeps whatever a cell was given (a schema version ``'2'`` stored as text, a value ``'abc'`` in a REAL
column, sub-scores that are not JSON), so nothing read from the file is trusted: the JSON the ledger wrote
(sub-scores, environments) goes through ``io.parse`` (bounded, strict), and each column is checked for the
type and range ``records.Entry`` / ``records.Plan`` allow. A bad cell is one EvidenceError line (exit 2):
the file, the record (id, model, metric), the column, the value (shortened) and the fix.
"""

from __future__ import annotations

import math
import numbers
import re
import sqlite3
from pathlib import Path

from ...io.parse import ParseError, parse_json, short
from .. import EvidenceError
from .environment import canonical_fields
from .plan_chain import check_chain, first_chained
from .records import SHA_RE, Plan, Record, name_problem

STORED_JSON_CHARS = 1 << 20
STORED_JSON_DEPTH = 4
CACHED = 1 << 16  # distinct cell texts whose check is remembered (names, hashes, sub-scores, environments)
_FIX = "the ledger was changed outside vecmerge: delete that row or restore the file from a copy"


def _changed(path: Path, what: str, column: str, value: object, problem: str) -> EvidenceError:
    return EvidenceError(f"{path}: {what}: {column} {short(value, 60)} {problem}; {_FIX}")


def _real(value: object) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def _json(path: Path, what: str, column: str, text: object) -> object:
    if not isinstance(text, str):
        raise _changed(path, what, column, text, "is not JSON text")
    try:
        return parse_json(text, path, max_depth=STORED_JSON_DEPTH, max_chars=STORED_JSON_CHARS)
    except ParseError as err:
        raise _changed(path, what, column, text, f"is not valid JSON ({err.problem.split('; ')[0]})") from None


def schema_version(rows: list[tuple], path: Path, newest: int) -> int:
    """The version in the ``schema_version`` table's rows: one integer row, 1..``newest``.

    Raises:
        EvidenceError: no row, several, a version stored as text or a non-integer (changed outside vecmerge), or
            a version newer than ``newest`` (upgrade vecmerge).
    """
    if len(rows) != 1 or len(rows[0]) != 1:
        raise EvidenceError(f"{path}: the schema_version table holds {len(rows)} rows, a ledger has one; {_FIX}")
    version = rows[0][0]
    if isinstance(version, bool) or not isinstance(version, int):
        kind = "text" if isinstance(version, (str, bytes)) else type(version).__name__
        raise EvidenceError(f"{path}: the ledger's schema version {short(version, 40)} is stored as {kind}, not an "
                            f"integer; {_FIX}")
    if version > newest:
        raise EvidenceError(f"{path}: ledger schema version {version}, this vecmerge reads 1 to {newest}; "
                            "upgrade vecmerge")
    if version < 1:
        raise EvidenceError(f"{path}: ledger schema version {version} does not exist (1 to {newest}); {_FIX}")
    return version


def _shown(name: object) -> str:
    """A stored name as a message shows it: as it is when it is a plain name, else quoted and shortened."""
    return name if isinstance(name, str) and name_problem(name, "name") is None and len(name) <= 60 \
        else short(name, 30)


def _what(rid: object, model: object, metric: object) -> str:
    return f"record {short(rid, 20)} ({_shown(model)}, {_shown(metric)})"


def _stored_subs(path: Path, what: str, text: object) -> tuple[tuple[str, float], ...]:
    """A record's stored sub-scores as sorted pairs; refused unless a JSON object of finite numbers."""
    try:
        subs = parse_json(text, path, max_depth=STORED_JSON_DEPTH, max_chars=STORED_JSON_CHARS) if isinstance(
            text, str) else None
    except ParseError as e:
        subs, why = None, e.problem.split("; ")[0]
    else:
        why = "not a JSON object of numbers" if isinstance(text, str) else "not a JSON object"
    if isinstance(subs, dict) and all(_real(v) and name_problem(k, "key") is None for k, v in subs.items()):
        return tuple(sorted((k, float(v)) for k, v in subs.items()))
    raise EvidenceError(f"{path}: {what}: its stored sub-scores {short(text, 60)} are unreadable ({why}); {_FIX}")


_NAMES: set = set()  # cell texts read as good names, hashes, sub-scores and environments (at most CACHED each):
_SHAS: set = set()  # a ledger repeats its models, metrics, sources, clusters and items on row after row
_SUBS: dict = {}
_ENVS: dict = {}


_NEW, _SET = object.__new__, object.__setattr__
_NAME_RE = re.compile(r"[^\s\x00-\x1f\x7f-\x9f](?:[^\x00-\x1f\x7f-\x9f]*[^\s\x00-\x1f\x7f-\x9f])?")


def is_name(text: object) -> bool:
    """``name_problem(text) is None``, fast: a name seen before, or text without edge spaces or control characters
    (``re``'s ``\\s`` is ``str.isspace``, what ``str.strip`` removes)."""
    return text in _NAMES or (type(text) is str and _NAME_RE.fullmatch(text) is not None)


def _remember(table: set | dict, key: object, value: object = None) -> None:
    if len(table) >= CACHED:
        table.clear()
    if isinstance(table, set):
        table.add(key)
    else:
        table[key] = value


def record_from_row(row: tuple, path: Path) -> Record:
    """A Record from one ``schema.RECORD_COLUMNS`` row, every cell checked (module docstring).

    A row whose every text cell was seen good before (``_NAMES``, ``_SHAS``, ``_SUBS``, ``_ENVS``) and whose
    numbers are finite floats takes the fast path; any other row is checked cell by cell (``_checked``)."""
    rid, model, sha, metric, value, subs, stderr, item, cluster, source, note, created, subscore, env = row
    if (type(rid) is int and is_name(model) and is_name(metric) and is_name(source)
            and (item is None or is_name(item)) and (cluster is None or is_name(cluster))
            and (subscore is None or is_name(subscore)) and (sha is None or sha in _SHAS)
            and type(value) is float and value - value == 0
            and (stderr is None or (type(stderr) is float and stderr - stderr == 0 and stderr >= 0))
            and (note is None or type(note) is str) and type(created) is str and subs in _SUBS
            and (env is None or env in _ENVS)):
        rec = _NEW(Record)  # the frozen dataclass's __init__ without its 15 guarded setattrs: the same object
        _SET(rec, "__dict__", {"id": rid, "model": model, "sha256": sha, "metric": metric, "value": value,
                               "subs": _SUBS[subs], "stderr": stderr, "item": item, "cluster": cluster,
                               "source": source, "note": note, "created": created, "subscore": subscore,
                               "env": () if env is None else _ENVS[env], "stale": False})
        return rec
    return _checked(row, path)


def _checked(row: tuple, path: Path) -> Record:
    """``record_from_row``'s cell-by-cell check (the first bad cell raises); the good cells are remembered."""
    rid, model, sha, metric, value, subs, stderr, item, cluster, source, note, created, subscore, env = row
    if isinstance(rid, bool) or not isinstance(rid, int):
        raise _changed(path, _what(rid, model, metric), "id", rid, "is not an integer")
    for column, text in (("model", model), ("metric", metric), ("source", source), ("item", item),
                         ("cluster", cluster), ("subscore", subscore)):
        if text is None and column in ("item", "cluster", "subscore"):
            continue
        if (p := name_problem(text, column)) is not None:
            raise _changed(path, _what(rid, model, metric), column, text, f"is not a name ({p.split(': ', 1)[-1]})")
        _remember(_NAMES, text)
    if sha is not None and not (isinstance(sha, str) and SHA_RE.fullmatch(sha)):
        raise _changed(path, _what(rid, model, metric), "sha256", sha, "is not 64 lowercase hex digits")
    problem = None
    if not _real(value):
        problem = ("value", value, "is not a finite number")
    elif stderr is not None and not (_real(stderr) and stderr >= 0):
        problem = ("stderr", stderr, "is not a finite number >= 0")
    elif note is not None and not isinstance(note, str):
        problem = ("note", note, "is not text")
    elif not isinstance(created, str):
        problem = ("created", created, "is not a time")
    if problem is not None:
        raise _changed(path, _what(rid, model, metric), *problem)
    pairs = _stored_subs(path, _what(rid, model, metric), subs)
    fields = () if env is None else _stored_env(path, _what(rid, model, metric), env)
    if sha is not None:
        _remember(_SHAS, sha)
    _remember(_SUBS, subs, pairs)
    if env is not None:
        _remember(_ENVS, env, fields)
    return Record(rid, model, sha, metric, float(value), pairs, None if stderr is None else float(stderr), item,
                  cluster, source, note, created, subscore, fields)


def stored_pairs(path: Path, column: str, text: object) -> tuple:
    """A stored ``subs`` or ``env`` cell as the pairs a record holds (checked as ``record_from_row`` checks it)."""
    what = f"a record's {column}"
    return _stored_subs(path, what, text) if column == "subs" else _stored_env(path, what, text)


def _stored_env(path: Path, what: str, env: object) -> tuple[tuple[str, str], ...]:
    """A record's stored environment as canonical ``(key, text)`` pairs; refused unless it is one."""
    stored = _json(path, what, "env", env)
    if not isinstance(stored, dict) or not all(isinstance(v, str) for v in stored.values()):
        raise _changed(path, what, "env", env, "is not a JSON object of environment fields and texts")
    try:
        fields = canonical_fields(stored, "env")
    except EvidenceError as err:
        raise _changed(path, what, "env", env, f"is not an environment ({err})") from None
    if fields != tuple(sorted(stored.items())):
        raise _changed(path, what, "env", env, "is not in canonical form")
    return fields


def direction_from_row(metric: object, higher: object, path: Path) -> tuple[str, bool]:
    """``(metric, higher_is_better)`` from a ``directions`` row: the flag must be the integer 0 or 1."""
    what = f"direction of {short(metric, 40)}"
    if (p := name_problem(metric, "metric")) is not None:
        raise _changed(path, what, "metric", metric, f"is not a name ({p.split(': ', 1)[-1]})")
    if isinstance(higher, bool) or not isinstance(higher, int) or higher not in (0, 1):
        raise _changed(path, what, "higher_is_better", higher, "is not true (1) or false (0)")
    return str(metric), bool(higher)  # a name (name_problem) is text


def plan_from_row(row: tuple, path: Path) -> Plan:
    """A Plan from one ``schema.PLAN_COLUMNS`` row: its flag 0/1, then ``Plan.problems`` (every field checked),
    its test among the registry's plan tests (``records.PLAN_TESTS``)."""
    what = f"plan {short(row[0], 20)}"
    if isinstance(row[0], bool) or not isinstance(row[0], int):
        raise _changed(path, what, "id", row[0], "is not an integer")
    higher = row[9]
    if isinstance(higher, bool) or not isinstance(higher, int) or higher not in (0, 1):
        raise _changed(path, what, "higher_is_better", higher, "is not true (1) or false (0)")
    design = row[15]
    if design is not None:
        design = _json(path, what, "design", design)
    if row[16] is not None and not (isinstance(row[16], str) and SHA_RE.fullmatch(row[16])):
        raise _changed(path, what, "chain", row[16], "is not 64 lowercase hex digits")
    cells = [*row[:9], bool(higher), *row[10:15], design, row[16]]
    plan = Plan(*cells)
    problems = plan.problems()
    if isinstance(plan.after_record, bool) or not isinstance(plan.after_record, int):
        problems.append(f"after_record: {plan.after_record!r} is not a record id")
    if not isinstance(plan.created, str):
        problems.append(f"created: {plan.created!r} is not a time")
    if problems:
        raise EvidenceError(f"{path}: {what}: {problems[0]}; {_FIX}")
    return plan


def check_rows(con: sqlite3.Connection, path: Path, record_columns: str, plan_columns: str) -> None:
    """Every stored row a write builds on, checked as a read would (``record_from_row``, ``direction_from_row``,
    ``plan_from_row``): the first bad one raises its EvidenceError line. A write calls this inside its
    transaction before it writes, so a ledger changed outside vecmerge is refused with nothing written, and a
    ledger a write accepted is one every reader reads. It costs a read of the whole ledger per write (about
    0.75 s per 50,000 records).

    Args:
        record_columns, plan_columns (str): the column lists that read ``schema.RECORD_COLUMNS`` and
            ``schema.PLAN_COLUMNS`` from this ledger (``schema.record_select``).
    """
    for metric, higher in con.execute("SELECT metric, higher_is_better FROM directions ORDER BY metric"):
        direction_from_row(metric, higher, path)
    for row in con.execute(f"SELECT {record_columns} FROM records ORDER BY id"):
        record_from_row(row, path)
    rows = con.execute(f"SELECT {plan_columns} FROM plans ORDER BY id").fetchall()
    for row in rows:
        plan_from_row(row, path)
    check_chain(rows, path, first_chained(con))
