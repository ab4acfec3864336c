"""Lineage from declared parents: descends, common ancestor, unrelated (declared roots), unknown, cycles."""

from __future__ import annotations

import pytest

from vecmerge.evidence import EvidenceError, LineageError
from vecmerge.workspace.lineage import chain, check_parents, relation

# The user's trajectories: v16 -> v28 -> v51 (v51 was made from v28); v54 retrained from v28's data
# (recorded here as a child of v16); v58 made from v54; v36 an item-only probe trained from the base.
PARENTS = {"v16": None, "v28": "v16", "v51": "v28", "v54": "v16", "v58": "v54", "v36": None, "v99": "elsewhere"}


def test_chain():
    assert chain("v51", PARENTS) == ("v51", "v28", "v16")
    assert chain("unlisted", PARENTS) == ("unlisted",)


def test_descends_both_ways():
    r = relation("v51", "v28", PARENTS)
    assert (r.kind, r.ancestor, r.related) == ("x_descends_from_y", "v28", True)
    assert r.text == "v51 descends from v28 (1 generation)"
    r = relation("v16", "v51", PARENTS)
    assert (r.kind, r.ancestor) == ("y_descends_from_x", "v16") and r.text == "v51 descends from v16 (2 generations)"
    assert relation("v28", "v28", PARENTS).kind == "same"


def test_nearest_common_ancestor():
    r = relation("v51", "v58", PARENTS)
    assert (r.kind, r.ancestor) == ("common_ancestor", "v16")
    assert r.text == "common ancestor v16 (v51: 2 generations up, v58: 2 generations up)"
    assert r.to_dict()["x_chain"] == ["v51", "v28", "v16"]


def test_unrelated_only_between_declared_roots():
    r = relation("v51", "v36", PARENTS)
    assert r.kind == "unknown" and not r.related and "no parent recorded for v16 or v36" in r.text
    r = relation("v51", "v36", PARENTS, roots={"v16", "v36"})
    assert r.kind == "unrelated" and r.text == "unrelated: v51 traces back to v16, v36 to v36, both roots"
    assert relation("v99", "v51", PARENTS, roots={"v16"}).kind == "unknown"  # v99's chain ends at 'elsewhere'
    assert relation("a", "b", {}).kind == "unknown"  # nothing recorded at all


def test_an_ancestor_missing_from_the_map_still_joins():
    assert relation("v99", "elsewhere", PARENTS).kind == "x_descends_from_y"


def test_cycles_are_named():
    loop = {"a": "b", "b": "c", "c": "a", "d": "a"}
    with pytest.raises(LineageError, match=r"^lineage cycle: a -> b -> c -> a "):
        relation("d", "x", loop)
    with pytest.raises(LineageError, match=r"lineage cycle: a -> b -> c -> a \(fix the parent: keys"):
        check_parents(loop)
    with pytest.raises(LineageError, match=r"lineage cycle: s -> s"):
        chain("s", {"s": "s"})
    assert issubclass(LineageError, EvidenceError)
    check_parents(PARENTS)
