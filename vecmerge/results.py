"""Typed results that read as the JSON they print: ``report.summary`` or ``report["summary"]``.

A command's result is a frozen dataclass (its fields typed and documented, visible to type checkers) and,
at the same time, a read-only mapping of exactly the keys ``to_dict()`` prints, so code written against
the JSON keeps working. ``to_dict()`` is the one serializer name (``outputs.manifest.jsonable`` calls it).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

KEY = "json_key"    # field metadata: the JSON name of a field, where the Python name must differ (``dir``)
OPTIONAL = "omit_when_none"  # field metadata: the key is left out of the JSON when the value is None


def json_meta(key: str | None = None, *, optional: bool = False) -> dict:
    """A field's metadata: its JSON name (``key``) and whether None leaves the key out (``optional``)."""
    return {KEY: key, OPTIONAL: optional}


def json_field(key: str | None = None, *, optional: bool = False, default: Any = ...):
    """A dataclass field with its JSON name (``key``) and whether None leaves the key out (``optional``)."""
    meta = json_meta(key, optional=optional)
    return field(metadata=meta) if default is ... else field(default=default, metadata=meta)


@dataclass(frozen=True, eq=False)
class Result(Mapping):
    """Base of typed results: fields in JSON order; ``to_dict()`` is the JSON; the mapping reads it."""

    def to_dict(self) -> dict:
        """``{json key: value}`` in field order (optional fields that are None left out)."""
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.metadata.get(OPTIONAL) and value is None:
                continue
            out[f.metadata.get(KEY) or f.name] = value
        return out

    def __getitem__(self, key: str) -> Any:
        return self.to_dict()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.to_dict())

    def __len__(self) -> int:
        return len(self.to_dict())

    def __repr__(self) -> str:
        shown = ", ".join(f"{k}={v!r}" for k, v in list(self.to_dict().items())[:4])
        return f"{type(self).__name__}({shown}, ...)"
