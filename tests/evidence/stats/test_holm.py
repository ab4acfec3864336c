"""Holm's step-down correction: the hand computation of its docstring, and closed testing by brute force."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from vecmerge.evidence import EvidenceError
from vecmerge.evidence.stats.holm import holm


def test_the_docstring_example_by_hand():
    """p = (0.01, 0.04, 0.03): sorted 0.01, 0.03, 0.04 -> 3*0.01 = 0.03, max(0.03, 2*0.03) = 0.06,
    max(0.06, 1*0.04) = 0.06; in the original order (0.03, 0.06, 0.06)."""
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06], abs=1e-15)
    keyed = holm({"video": 0.01, "goods": 0.04, "item": 0.03})
    assert keyed == pytest.approx({"video": 0.03, "goods": 0.06, "item": 0.06}, abs=1e-15)
    assert [k for k, p in keyed.items() if p <= 0.05] == ["video"]


def closed_testing(p, alpha):
    """Reject H_i iff every intersection S holding i is rejected by Bonferroni: min_{j in S} p_j <= alpha / |S|."""
    m = len(p)
    return [all(min(p[j] for j in s) <= alpha / len(s)
                for r in range(1, m + 1) for s in itertools.combinations(range(m), r) if i in s) for i in range(m)]


def test_holm_is_closed_testing_with_bonferroni_and_never_rejects_fewer():
    rng = np.random.default_rng(24)
    for _ in range(300):
        m = int(rng.integers(1, 7))
        p = list(rng.uniform(0, 0.2, m) ** rng.uniform(0.5, 2))
        adjusted = holm(p)
        for alpha in (0.01, 0.05, 0.1):
            assert [a <= alpha for a in adjusted] == closed_testing(p, alpha)
            assert sum(a <= alpha for a in adjusted) >= sum(min(1, m * x) <= alpha for x in p)  # Bonferroni
        assert all(a >= x for a, x in zip(adjusted, p)) and max(adjusted) <= 1.0


def test_edge_cases():
    assert holm([]) == [] and holm({}) == {}
    assert holm([0.2]) == [0.2] and holm([0.6, 0.7]) == [1.0, 1.0]
    assert holm([0.02, 0.02]) == [0.04, 0.04]  # ties: the same whatever their order
    with pytest.raises(EvidenceError, match="not in"):
        holm([0.01, float("nan")])
    with pytest.raises(EvidenceError, match=r"-0.1 of 'x' is not in"):
        holm({"x": -0.1})
