"""``evidence export``'s text, streamed straight from the ledger's rows: CSV or JSON, no Record or dict per row.

``Ledger.iter_rows`` hands over the stored cells in batches, every cell checked as every read checks it (a tampered
one raises naming its record). What repeats from row to row (names, hashes, times, items, the sub-score and
environment cells) is formatted once and looked up (``_Memo``); a batch becomes one piece of text. The text is the
same, byte for byte, as formatting every ``Record.to_dict`` at once: ``export_csv_text`` for CSV (cells through
``io.safe_text``), ``json.dumps({"directions", "records"}, indent=2)`` for JSON (tests/evidence/importers/
test_export.py compares both).
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from json.encoder import encode_basestring_ascii as _json_text

from ...io.safe_text import printable, spreadsheet_cell
from ..ledger.environment import environment_id
from ..ledger.ledger import Ledger
from ..ledger.stored import stored_pairs

__all__ = ["csv_columns", "csv_cell", "export_csv", "export_json"]

CACHED = 1 << 16  # distinct cells a memo keeps (then it starts again)


def csv_columns(subs: Sequence[str], envs: Sequence[str], subscore: bool) -> list[str]:
    """The CSV columns of an export: the record's, ``subscore`` if any record names one, ``sub.KEY`` for each
    sub-score key, then ``env_id`` and ``env.KEY`` if any record has an environment (keys sorted)."""
    return ["model", "metric", "value", "stderr", "item", "cluster", "note", "sha256", "source", "created", "stale",
            "id", *(["subscore"] if subscore else []), *(f"sub.{k}" for k in subs), *(["env_id"] if envs else []),
            *(f"env.{k}" for k in envs)]


def csv_cell(text: str | None) -> str | None:
    """A text cell as an export writes it: ``spreadsheet_cell(printable(text))``; None stays None (an empty cell)."""
    return None if text is None else spreadsheet_cell(printable(text))


class _Memo(dict):
    """``memo[key]``: ``make(key)``, made once while remembered (at most ``CACHED`` keys, then it starts again)."""

    def __init__(self, make: Callable):
        super().__init__()
        self.make = make

    def __missing__(self, key):
        if len(self) >= CACHED:
            self.clear()
        value = self[key] = self.make(key)
        return value


def export_csv(ledger: Ledger, current_sha: Mapping[str, str | None] | None = None) -> Iterator[str]:
    """The ledger as CSV (``csv_columns``; the cells of ``export_csv_text``), a header then one piece per batch.

    Each text cell is ``csv_cell`` quoted as the ``csv`` module quotes it (``_csv_field``), looked up; the numbers
    are written as the ``csv`` module writes them: ``repr`` of a float, ``str`` of an int or bool, None empty.

    Args:
        current_sha (Mapping[str, str | None] | None): each model's current content sha256 (the ``stale`` column).
    """
    subs, envs, named = ledger.export_columns()
    path, field = ledger.path, _Memo(lambda t: _csv_field(csv_cell(t)))
    yield ",".join(field[c] for c in csv_columns(subs, envs, named)) + "\n"
    sub_cells = _Memo(lambda t: _subs_csv(stored_pairs(path, "subs", t), subs))
    env_cells = _Memo(lambda t: _env_csv(stored_pairs(path, "env", t) if t is not None else (), envs, field))
    line = "%s,%s,%r,%s,%s,%s,%s,%s,%s,%s,%s,%s" + (",%s" if named else "%.0s") + "%s%s\n"  # %.0s: no column
    for rows in ledger.iter_rows(current_sha):
        yield "".join([line % (field[model], field[metric], value, "" if stderr is None else repr(stderr),
                               field[item], field[cluster], field[note], sha or "", field[source], field[created],
                               stale, rid, field[subscore], sub_cells[stext], env_cells[etext])
                       for rid, model, sha, metric, value, stext, stderr, item, cluster, source, note, created,
                       subscore, etext, stale in rows])


_QUOTED = re.compile(r'[,"\r\n]')


def _csv_field(text: str | None) -> str:
    """``text`` as the ``csv`` module writes it as one field of a row (``delimiter=","``, minimal quoting)."""
    if text is None or _QUOTED.search(text) is None:
        return text or ""
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerow([text, ""])
    return buf.getvalue()[:-2]


def _subs_csv(pairs: tuple, subs: Sequence[str]) -> str:
    """The ``sub.KEY`` cells of a row, each after a comma."""
    got = dict(pairs)
    return "".join("," if got.get(k) is None else f",{got[k]!r}" for k in subs)


def _env_csv(fields: tuple, envs: Sequence[str], field: _Memo) -> str:
    """The ``env_id`` and ``env.KEY`` cells of a row, each after a comma (none without ``env`` columns)."""
    if not envs:
        return ""
    got = dict(fields)
    return "".join("," + field[t] for t in (environment_id(fields), *(got.get(k) for k in envs)))


# one record as json.dumps(Record.to_dict(), indent=2) writes it inside the list: the keys in to_dict's order, the
# value by %r (repr of a finite float), each other one already JSON text; env_id, then the sub.* and env.* keys
_RECORD = "{\n      " + ",\n      ".join(f'"{k}": {"%r" if k == "value" else "%s"}' for k in (
    "id", "model", "sha256", "metric", "value", "stderr", "item", "cluster", "source", "note", "created", "stale",
    "subscore")) + ',\n      "env_id": %s%s%s\n    }'


def export_json(ledger: Ledger, current_sha: Mapping[str, str | None] | None = None) -> Iterator[str]:
    """The ledger as ``json.dumps({"directions": ..., "records": [Record.to_dict(), ...]}, indent=2)`` and a line
    break, written a batch of records at a time (each value by the C encoder: ``json``'s indenting encoder is pure
    Python, a tenth of the speed).

    Args:
        current_sha (Mapping[str, str | None] | None): each model's current content sha256 (the ``stale`` key).
    """
    head = json.dumps(ledger.directions(), indent=2).replace("\n", "\n  ")
    yield f'{{\n  "directions": {head},\n  "records": ['
    path, text = ledger.path, _Memo(lambda t: "null" if t is None else _json_text(t))
    sub_keys = _Memo(lambda t: "".join(f",\n      {_json_text('sub.' + k)}: {v!r}"
                                       for k, v in stored_pairs(path, "subs", t)))
    env_ids = _Memo(lambda t: _json_text(environment_id(stored_pairs(path, "env", t) if t is not None else ())))
    env_keys = _Memo(lambda t: "" if t is None else "".join(f",\n      {_json_text('env.' + k)}: {_json_text(v)}"
                                                             for k, v in stored_pairs(path, "env", t)))
    sep = "\n    "
    for rows in ledger.iter_rows(current_sha):
        # a checked row's id is an int, its value a finite float, its stderr one or None (stored.checked_rows)
        yield sep + ",\n    ".join([_RECORD % (
            rid, text[model], text[sha], text[metric], value, "null" if stderr is None else repr(stderr),
            text[item], text[cluster], text[source], text[note], text[created], "true" if stale else "false",
            text[subscore], env_ids[etext], sub_keys[stext], env_keys[etext])
            for rid, model, sha, metric, value, stext, stderr, item, cluster, source, note, created, subscore, etext,
            stale in rows])
        sep = ",\n    "
    yield ("]" if sep == "\n    " else "\n  ]") + "\n}\n"
