"""The feasible candidates' Pareto front (target gain against the protected sets' slack) and the top K.

A feasible result ``a`` dominates ``b`` when ``gain_a >= gain_b`` and ``slack_a >= slack_b`` with one strictly
greater (``gain``: the target's mean change; ``slack``: ``min_k (lower_k + M_k)``, what decides feasibility, the
lower bound of the set closest to its own margin, measured from that margin). The top K are the feasible results
of the highest gain (ties: the larger slack, then the recipe hash).
"""

from __future__ import annotations


def _dominates(a, b) -> bool:
    return a.objective >= b.objective and a.slack >= b.slack and (a.objective > b.objective or a.slack > b.slack)


def front(results: list) -> list:
    """The feasible results no other feasible result dominates, by gain descending (one per recipe hash)."""
    feasible = list({r.sha256: r for r in results if r.feasible}.values())
    out = [r for r in feasible if not any(_dominates(o, r) for o in feasible)]
    return sorted(out, key=lambda r: (-r.objective, -r.slack, r.sha256))


def top(results: list, k: int) -> list:
    """The ``k`` feasible results of the highest gain (module docstring), one per recipe hash."""
    feasible = list({r.sha256: r for r in results if r.feasible}.values())
    return sorted(feasible, key=lambda r: (-r.objective, -r.slack, r.sha256))[:k]
