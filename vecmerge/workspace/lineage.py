"""Lineage: how two models relate through their declared parents (``v51: {path: runs/v51, parent: v28}``).

The parent map is ``{name: parent name, or None when no parent is recorded}``; the caller builds it from
the workspace's ``parent:`` keys and from vecmerge manifests. A missing parent is not proof of a root: only
names passed in ``roots`` (trained straight from the base model, e.g. an entry that says ``parent: null``
explicitly) are known to have none. So two chains that never meet are "unrelated" only when both end at a
declared root, and "unknown" otherwise. The gate treats "unknown" as UNKNOWN, never as a pass.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ..errors import LineageError

KINDS = ("same", "x_descends_from_y", "y_descends_from_x", "common_ancestor", "unrelated", "unknown")


def chain(name: str, parents: Mapping[str, str | None], *, what: str = "parent") -> tuple[str, ...]:
    """``(name, parent, grandparent, ...)`` up to the first name whose parent is not recorded.

    Raises LineageError naming the cycle (``a -> b -> a``) when the parents loop (``what``: the key named in
    the message, ``parent`` or ``replicate_of``).
    """
    out, seen = [name], {name: 0}
    while (parent := parents.get(out[-1])) is not None:
        if parent in seen:
            loop = out[seen[parent]:] + [parent]
            kind = "lineage" if what == "parent" else what
            raise LineageError(f"{kind} cycle: {' -> '.join(loop)} (fix the {what}: keys in vecmerge.yaml)")
        seen[parent] = len(out)
        out.append(parent)
    return tuple(out)


def check_parents(parents: Mapping[str, str | None]) -> None:
    """Raise LineageError naming a cycle if any name's parents loop back on themselves."""
    for name in parents:
        chain(name, parents)


@dataclass(frozen=True)
class Relation:
    """The relation of X and Y; ``ancestor`` is Y, X, or the nearest common ancestor (else None).

    kind: one of ``same``, ``x_descends_from_y``, ``y_descends_from_x``, ``common_ancestor``,
    ``unrelated``, ``unknown``; ``text`` says it in words; ``x_chain``/``y_chain`` are the lineages used.
    """

    x: str
    y: str
    kind: str
    ancestor: str | None
    x_chain: tuple[str, ...]
    y_chain: tuple[str, ...]
    text: str

    @property
    def related(self) -> bool:
        """True when one lineage joins them (same, descends, or a common ancestor)."""
        return self.kind in ("same", "x_descends_from_y", "y_descends_from_x", "common_ancestor")

    def to_dict(self) -> dict:
        return {"x": self.x, "y": self.y, "kind": self.kind, "ancestor": self.ancestor, "related": self.related,
                "x_chain": list(self.x_chain), "y_chain": list(self.y_chain), "text": self.text}


def _generations(k: int) -> str:
    return f"{k} generation{'s' * (k != 1)}"


def relation(x: str, y: str, parents: Mapping[str, str | None], *, roots: Iterable[str] = ()) -> Relation:
    """How X and Y relate through ``parents`` (see the module docstring for "unrelated" vs "unknown").

    Args:
        x, y (str): the two models (e.g. the direction X - Y of a merge).
        parents (Mapping[str, str | None]): name -> parent name, or None when none is recorded.
        roots (Iterable[str]): names known to have no parent.
    """
    xs, ys = chain(x, parents), chain(y, parents)
    if x == y:
        return Relation(x, y, "same", x, xs, ys, f"{x} and {y} are the same model")
    if y in xs:
        k = xs.index(y)
        return Relation(x, y, "x_descends_from_y", y, xs, ys, f"{x} descends from {y} ({_generations(k)})")
    if x in ys:
        k = ys.index(x)
        return Relation(x, y, "y_descends_from_x", x, xs, ys, f"{y} descends from {x} ({_generations(k)})")
    in_y = set(ys)
    for i, z in enumerate(xs):
        if z in in_y:
            j = ys.index(z)
            return Relation(x, y, "common_ancestor", z, xs, ys,
                            f"common ancestor {z} ({x}: {_generations(i)} up, {y}: {_generations(j)} up)")
    roots = set(roots)
    if xs[-1] in roots and ys[-1] in roots:
        return Relation(x, y, "unrelated", None, xs, ys,
                        f"unrelated: {x} traces back to {xs[-1]}, {y} to {ys[-1]}, both roots")
    open_ends = [e for e in (xs[-1], ys[-1]) if e not in roots]
    return Relation(x, y, "unknown", None, xs, ys,
                    f"unknown: no recorded lineage joins {x} and {y} (no parent recorded for "
                    f"{' or '.join(dict.fromkeys(open_ends))})")
