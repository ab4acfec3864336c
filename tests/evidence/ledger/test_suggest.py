"""Did you mean: Levenshtein distances against hand-counted edits, and which names count as close."""

from __future__ import annotations

import pytest

from vecmerge.evidence.ledger.suggest import close_name, edit_distance


@pytest.mark.parametrize("a, b, d", [("v5l", "v51", 1), ("kitten", "sitting", 3), ("", "abc", 3), ("v51", "v51", 0),
                                     ("v28", "v82", 2), ("official_total", "oficial_totl", 2), ("ab", "ba", 2)])
def test_edit_distance_by_hand(a, b, d):
    assert edit_distance(a, b) == d == edit_distance(b, a)


def test_close_names():
    names = ["v28", "v51", "v54", "v54e2"]
    assert close_name("v5l", names) == "v51"      # one edit in three characters
    assert close_name("v99", names) is None       # two edits in three: unrelated
    assert close_name("v51", names) is None       # the name itself is no suggestion
    assert close_name("v54e3", names) == "v54e2"
    assert close_name("v58", names) == "v28"      # one edit from v28, v51 and v54: ties go to the first sorted
    assert close_name("offical_totl", ["official_total"]) == "official_total"
    assert close_name("x", ["y"]) is None         # a one-character name is never "close"
