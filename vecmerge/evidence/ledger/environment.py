"""The eval environment a score was measured under, its id, and the rule that never pools two of them.

Every record may carry the settings it was measured with (harness, harness_version, task_version, n_shot,
temperature, max_tokens, stop, do_sample, top_p, top_k, timeout, seed, any other KEY); records of different
settings are never pooled nor compared as if they were one measurement. Canonical form: KEY -> text, keys
sorted, each value by one rule whatever wrote it (shortest round-trip numbers, integral values as integers,
lower-case booleans, compact JSON for lists and mappings; null or empty: not recorded). The id is

    sha256(json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=True))[:12]

(the empty environment: ``44136fa355b3``, a different environment from any with fields).
Why the environment is part of the measurement, and the value rule in full: docs/design/evidence.md.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import numbers
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from .. import EvidenceError

KEY_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,63}")
MAX_VALUE_CHARS = 1000
ID_CHARS = 12
_NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")
_HEX = re.compile(r"[0-9a-f]{4,64}")


def _number_text(x: float) -> str:
    if x == int(x) and abs(x) < 2**53:
        return str(int(x))
    return repr(float(x))


def canonical_value(value: object, what: str) -> str | None:
    """The canonical text of one field's value (module docstring), None for "not recorded"; raises
    EvidenceError naming ``what`` for a value that cannot be one (a non-finite number, a control character)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, numbers.Real):
        x = float(value)
        if not math.isfinite(x):
            raise EvidenceError(f"{what}: {value!r} is not finite")
        return _number_text(x)
    if isinstance(value, (list, tuple, Mapping)):
        inner = _nested(value, what)
        if not inner:
            return None
        if isinstance(inner, list) and len(inner) == 1 and _plain(inner[0]):
            return canonical_value(inner[0], what)
        return json.dumps(inner, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    if not isinstance(value, str):
        raise EvidenceError(f"{what}: {value!r} is not a text, number or list")
    text = value.strip()
    if not text:
        return None
    if len(text) > MAX_VALUE_CHARS:
        raise EvidenceError(f"{what}: a value of {len(text)} characters (at most {MAX_VALUE_CHARS})")
    if any(ord(c) < 0x20 or 0x7f <= ord(c) <= 0x9f for c in text):
        raise EvidenceError(f"{what}: {text[:40]!r} holds a control character; remove it")
    if _NUMBER.fullmatch(text):
        x = float(text)
        return _number_text(x) if math.isfinite(x) else text
    if text.lower() in ("true", "false"):
        return text.lower()
    return text


def _plain(value: object) -> bool:
    return isinstance(value, str) and value == value.strip() and not any(ord(c) < 0x20 or 0x7f <= ord(c) <= 0x9f
                                                                          for c in value)


def _nested(value: object, what: str) -> object:
    """A list's or mapping's content for its canonical JSON: strings kept exactly (a stop sequence ``"\\n"`` is
    one), numbers and booleans as their canonical text, nulls left out, mappings by sorted key."""
    if isinstance(value, Mapping):
        out = {str(k): _nested(v, f"{what}.{k}") for k, v in value.items()}
        return {k: v for k, v in sorted(out.items()) if v is not None}
    if isinstance(value, (list, tuple)):
        return [v for v in (_nested(x, what) for x in value) if v is not None]
    if isinstance(value, str):
        if len(value) > MAX_VALUE_CHARS:
            raise EvidenceError(f"{what}: a value of {len(value)} characters (at most {MAX_VALUE_CHARS})")
        return value
    return canonical_value(value, what)


def key_problem(key: object) -> str | None:
    """Why ``key`` cannot name an environment field (None when it can)."""
    if not isinstance(key, str) or not KEY_RE.fullmatch(key):
        return (f"environment field {key!r}: use letters, digits, '_', '.' and '-' (at most 64, starting with a "
                "letter, digit or '_')")
    return None


def canonical_fields(fields: Mapping | Iterable[tuple[str, object]] | None, where: str = "env") -> tuple:
    """``fields`` as sorted ``(key, canonical text)`` pairs, fields that are not recorded left out.

    Raises:
        EvidenceError: one line naming ``where`` and the field, for a bad key or value.
    """
    pairs = list(fields.items()) if isinstance(fields, Mapping) else list(fields or ())
    out: dict[str, str] = {}
    for key, value in pairs:
        if (p := key_problem(key)) is not None:
            raise EvidenceError(f"{where}: {p}")
        text = canonical_value(value, f"{where}.{key}")
        if text is None:
            continue
        if key in out and out[key] != text:
            raise EvidenceError(f"{where}.{key}: given twice ({out[key]!r} and {text!r}); keep one")
        out[key] = text
    return tuple(sorted(out.items()))


@functools.lru_cache(maxsize=4096)
def environment_id(fields: tuple[tuple[str, str], ...]) -> str:
    """The first ``ID_CHARS`` hex digits of sha256 of the canonical JSON of the (canonical) fields."""
    text = json.dumps(dict(fields), sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode("ascii")).hexdigest()[:ID_CHARS]


@dataclass(frozen=True)
class Environment:
    """One eval environment: canonical ``(key, text)`` pairs, sorted; ``id`` their hash (module docstring)."""

    fields: tuple[tuple[str, str], ...] = ()

    @property
    def id(self) -> str:
        return environment_id(self.fields)

    def describe(self) -> str:
        """``key=value, ...`` (or ``no fields recorded``)."""
        return ", ".join(f"{k}={v}" for k, v in self.fields) or "no fields recorded"

    def to_dict(self) -> dict:
        return {"id": self.id, "fields": dict(self.fields)}


def differing(a: Environment, b: Environment) -> list[tuple[str, str | None, str | None]]:
    """The fields two environments differ in: ``(key, a's text or None, b's text or None)``, by key."""
    da, db = dict(a.fields), dict(b.fields)
    return [(k, da.get(k), db.get(k)) for k in sorted(set(da) | set(db)) if da.get(k) != db.get(k)]


def differences_text(envs: Sequence[Environment], limit: int = 4) -> str:
    """``temperature (0 in 3f2a.., 0.7 in 9b1c..), timeout (...)``: how the first environment differs from
    each of the others, the fields named once each."""
    seen: dict[str, list[str]] = {}
    first = envs[0]
    for other in envs[1:]:
        for key, va, vb in differing(first, other):
            parts = seen.setdefault(key, [f"{'unrecorded' if va is None else va} in {first.id}"])
            parts.append(f"{'unrecorded' if vb is None else vb} in {other.id}")
    shown = [f"{k} ({', '.join(dict.fromkeys(v))})" for k, v in list(seen.items())[:limit]]
    more = len(seen) - limit
    return ", ".join(shown) + (f" and {more} more field(s)" if more > 0 else "")


@dataclass(frozen=True)
class EnvChoice:
    """Which environments a command may use: ids (or id prefixes, 4+ hex digits) and ``KEY=VALUE`` filters.

    A record is kept when its environment's id starts with one of ``ids`` (any, when none are given) and
    it has every filter field at that value (compared in canonical form). Empty: every environment.
    """

    ids: tuple[str, ...] = ()
    fields: tuple[tuple[str, str], ...] = ()

    @classmethod
    def parse(cls, options: Iterable[str] | Mapping | str | None, where: str = "--env") -> EnvChoice:
        """From ``--env`` options (``ID`` or ``KEY=VALUE`` each), a gate config's ``env:`` (an id, or a mapping
        of fields) or None."""
        if options is None:
            return cls()
        if isinstance(options, Mapping):
            return cls((), canonical_fields(options, where))
        ids, pairs = [], []
        for option in [options] if isinstance(options, str) else options:
            key, sep, value = str(option).partition("=")
            if not sep:
                if not _HEX.fullmatch(key.strip()):
                    raise EvidenceError(f"{where} {option!r}: give an environment id (4 to 64 hex digits, as show "
                                        "--by env prints) or KEY=VALUE")
                ids.append(key.strip())
            else:
                if not value.strip():
                    raise EvidenceError(f"{where} {option!r}: give a value, e.g. {key.strip()}=0")
                pairs.append((key.strip(), value))
        return cls(tuple(ids), canonical_fields(pairs, where))

    def __bool__(self) -> bool:
        return bool(self.ids or self.fields)

    def matches(self, env: Environment) -> bool:
        have = dict(env.fields)
        return ((not self.ids or any(env.id.startswith(i) for i in self.ids))
                and all(have.get(k) == v for k, v in self.fields))

    def describe(self) -> str:
        return ", ".join([*self.ids, *(f"{k}={v}" for k, v in self.fields)])

    def to_dict(self) -> dict:
        return {"ids": list(self.ids), "fields": dict(self.fields)}


def environments(records: Iterable) -> dict[str, tuple[Environment, list]]:
    """Records grouped by environment id, in order of first appearance: ``{id: (Environment, [records])}``."""
    out: dict[str, tuple[Environment, list]] = {}
    for r in records:
        env = r.environment
        out.setdefault(env.id, (env, []))[1].append(r)
    return out


def one_environment(records: Sequence, choice: EnvChoice | None, what: str) -> tuple[Environment | None, list]:
    """The records of ``choice`` and the one environment they share; refuses several ("not the same measurement").

    Args:
        records: the records a statistic would pool (``Record`` with ``.environment``).
        choice (EnvChoice | None): the user's ``--env``; None or empty: every environment.
        what (str): what is measured, for the message (``v51 and v28 on toy_acc``).

    Returns:
        (Environment or None when no record is left, the records of it).

    Raises:
        EvidenceError: the records span several environments; the message names the fields that differ and
            the environments with their record counts, and how to pick one.
    """
    choice = choice or EnvChoice()
    kept = [r for r in records if choice.matches(r.environment)]
    groups = environments(kept)
    if len(groups) <= 1:
        env = next(iter(groups.values()))[0] if groups else None
        if env is None and records and choice:
            raise EvidenceError(f"{what}: no record matches --env {choice.describe()}; the records' environments: "
                                + ", ".join(f"{e.id} ({e.describe()})" for e, _ in environments(records).values()))
        return env, kept
    envs = [e for e, _ in groups.values()]
    counts = ", ".join(f"{e.id} ({_count(rs)})" for e, rs in groups.values())
    raise EvidenceError(f"{what}: not the same measurement: the records were made under {len(envs)} eval "
                        f"environments that differ in {differences_text(envs)}; environments: {counts}; pick one "
                        "with --env ID or --env KEY=VALUE")


def records_of_one_environment(records: Sequence, models: Iterable[str], choice: EnvChoice | None,
                               what: str) -> tuple[Environment | None, list]:
    """``one_environment`` over the records of ``models``, then every record (of any model) of that environment:
    the records a statistic about ``models`` may pool (the ledger's noise included)."""
    models = set(models)
    chosen, _ = one_environment([r for r in records if r.model in models], choice, what)
    if chosen is None:
        return None, [r for r in records if (choice or EnvChoice()).matches(r.environment)]
    return chosen, [r for r in records if r.environment.id == chosen.id]


def _count(records: Iterable) -> str:
    by: dict[str, int] = {}
    for r in records:
        by[r.model] = by.get(r.model, 0) + 1
    parts = [f"{m} {n}" for m, n in list(by.items())[:4]]
    return ", ".join(parts) + (" ..." if len(by) > 4 else "")
