"""A typed name that is almost a workspace name: ``evidence add v5l 1.01`` means v51, not a new model.

    distance     Levenshtein's edit distance: the fewest insertions, deletions and substitutions that turn
                 one name into the other (dynamic programming over prefixes)
    close        distance <= 2 and at most a third of the typed name's length, so ``v5l`` (distance 1 from
                 ``v51``) is close but ``v99`` (distance 2 from ``v28``, in 3 characters) is not: unrelated
                 names stay free to name external models
"""

from __future__ import annotations

from collections.abc import Iterable

MAX_DISTANCE = 2


def edit_distance(a: str, b: str) -> int:
    """Levenshtein distance of ``a`` and ``b`` (insertions, deletions, substitutions, each 1)."""
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        current = [i]
        for j, cb in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb)))
        previous = current
    return previous[-1]


def close_name(name: str, candidates: Iterable[str]) -> str | None:
    """The candidate nearest to ``name`` if it is close (module docstring), else None; None as well when ``name``
    is a candidate itself (ties: the first in sorted order)."""
    candidates = set(candidates)
    if name in candidates:
        return None
    limit = min(MAX_DISTANCE, len(name) // 3)
    scored = sorted((edit_distance(name, c), c) for c in candidates)
    return scored[0][1] if scored and 0 < scored[0][0] <= limit else None
