"""Holm's step-down correction (Holm 1979, "A simple sequentially rejective multiple test procedure").

    sort the m p-values ascending: p_(1) <= p_(2) <= ... <= p_(m)
    adjusted p_(i) = max_{j <= i} min(1, (m - j + 1) * p_(j))       (running maximum: never decreasing)
    reject H_(i) iff adjusted p_(i) <= alpha

By hand, p = (0.01, 0.04, 0.03), m = 3: sorted 0.01, 0.03, 0.04 -> 3 * 0.01 = 0.03, max(0.03, 2 * 0.03) = 0.06,
max(0.06, 1 * 0.04) = 0.06; in the original order (0.03, 0.06, 0.06): at alpha = 0.05 only the first is rejected.
Holm keeps the chance of ANY false claim across the family at alpha whatever the dependence between the
sub-scores. Why a family needs it, and Holm as closed testing: docs/design/evidence.md.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import overload

from .. import EvidenceError


@overload
def holm(pvalues: Mapping[str, float]) -> dict[str, float]: ...


@overload
def holm(pvalues: Sequence[float]) -> list[float]: ...


def holm(pvalues: Mapping[str, float] | Sequence[float]) -> dict[str, float] | list[float]:
    """Holm-adjusted p-values (module docstring), in the order and shape given.

    Args:
        pvalues (Mapping[str, float] | Sequence[float]): m p-values in [0, 1], keyed (a dict comes back) or in
            order (a list comes back). Ties keep their order (the result does not depend on it).

    Returns:
        dict[str, float] | list[float]: ``adjusted[i] = max_{j <= rank(i)} min(1, (m - j + 1) p_(j))``.
    """
    if isinstance(pvalues, Mapping):
        keys = list(pvalues)
        return dict(zip(keys, _adjusted([float(pvalues[k]) for k in keys], keys)))
    return _adjusted([float(p) for p in pvalues], range(len(pvalues)))


def _adjusted(values: list[float], keys: Sequence[object]) -> list[float]:
    """Holm's adjusted ``values`` in their order (``keys`` name them when one is not a p-value)."""
    for k, p in zip(keys, values):
        if not 0.0 <= p <= 1.0:  # also refuses NaN
            raise EvidenceError(f"holm: p-value {p!r} of {k!r} is not in [0, 1]")
    m = len(values)
    order = sorted(range(m), key=lambda i: values[i])
    adjusted = [0.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * values[i]))
        adjusted[i] = running
    return adjusted
