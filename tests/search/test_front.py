"""The front (feasible, not dominated in gain and the protected sets' slack to their margins) and the top K."""

from __future__ import annotations

from types import SimpleNamespace

from vecmerge.search.front import front, top


def _r(sha, gain, slack, feasible=True):
    """``slack``: min over the protected sets of lower + M (what the front weighs against the gain)."""
    return SimpleNamespace(sha256=sha, objective=gain, slack=slack, feasible=feasible)


def test_the_front_keeps_the_undominated_feasible_results():
    rs = [_r("a", 3.0, -0.04), _r("b", 2.0, -0.01), _r("c", 1.0, -0.02), _r("d", 5.0, -1.0, False),
          _r("e", 2.0, -0.03), _r("b", 2.0, -0.01)]
    assert [r.sha256 for r in front(rs)] == ["a", "b"]  # c and e are dominated by b, d is infeasible


def test_top_is_by_gain_then_worst_change_then_hash():
    rs = [_r("b", 2.0, -0.01), _r("a", 2.0, -0.01), _r("c", 2.0, 0.0), _r("d", 9.0, -1.0, False), _r("e", 1.0, 0.0)]
    assert [r.sha256 for r in top(rs, 3)] == ["c", "a", "b"]
    assert top([_r("d", 9.0, -1.0, False)], 3) == []
