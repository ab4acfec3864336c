"""The group-sequential engine against published tables and an independent multivariate normal computation.

Published: Jennison and Turnbull (2000), Table 2.1 (Pocock's C_P(K, 0.05)) and Table 2.3 (O'Brien and Fleming's
C_B(K, 0.05)), two-sided alpha 0.05, K equally spaced looks; the Lan-DeMets spending boundaries of gsDesign
(``gsDesign(k = 5, test.type = 1, alpha = 0.025, sfu = sfLDOF)`` and ``sfu = sfLDPocock``), printed to 4
decimals in its manual. Independent: scipy's multivariate normal CDF (Genz) over the looks' correlation
sqrt(t_j / t_k), which shares nothing with the recursion.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from vecmerge.evidence import EvidenceError
from vecmerge.evidence.stats.group_sequential import (
    Spending,
    boundary,
    constant_bounds,
    crossing,
    spending_bounds,
    spent,
)

POCOCK_TABLE = {1: 1.960, 2: 2.178, 3: 2.289, 4: 2.361, 5: 2.413, 10: 2.555}  # J&T Table 2.1, alpha 0.05
OBF_TABLE = {1: 1.960, 2: 1.977, 3: 2.004, 4: 2.024, 5: 2.040, 10: 2.087}  # J&T Table 2.3, alpha 0.05
LD_OBF_5 = [4.8769, 3.3569, 2.6803, 2.2898, 2.0310]  # gsDesign sfLDOF, k = 5, one-sided 0.025
LD_POCOCK_5 = [2.4380, 2.4268, 2.4101, 2.3966, 2.3859]  # gsDesign sfLDPocock, k = 5, one-sided 0.025


@pytest.mark.parametrize("looks", sorted(POCOCK_TABLE))
def test_pocock_constants_equal_jennison_turnbull_table_2_1(looks):
    assert round(constant_bounds(looks, 0.05, "pocock"), 3) == POCOCK_TABLE[looks]


@pytest.mark.parametrize("looks", sorted(OBF_TABLE))
def test_obrien_fleming_constants_equal_jennison_turnbull_table_2_3(looks):
    assert round(constant_bounds(looks, 0.05, "obf"), 3) == OBF_TABLE[looks]


@pytest.mark.parametrize("family, table", [("obf", LD_OBF_5), ("pocock", LD_POCOCK_5)])
def test_lan_demets_spending_boundaries_equal_gsdesign_to_3_digits(family, table):
    got = spending_bounds([0.2, 0.4, 0.6, 0.8, 1.0], 0.025, family)
    assert got == pytest.approx(table, abs=5e-4)


def test_crossing_probabilities_equal_scipys_multivariate_normal():
    """P(exit above at look 1 or 2) = 1 - P(Z1 < b1, Z2 < b2), Corr = sqrt(I1/I2), also under a drift θ."""
    info, upper = [0.4, 1.0], [2.6, 2.0]
    corr = math.sqrt(info[0] / info[1])
    for theta in (0.0, 1.5):
        mean = [theta * math.sqrt(i) for i in info]
        mvn = stats.multivariate_normal(mean, [[1, corr], [corr, 1]])
        want = 1 - mvn.cdf(upper)
        up, down = crossing(info, [-math.inf] * 2, upper, theta)
        assert up.sum() == pytest.approx(want, abs=2e-6) and down.sum() == 0.0
        assert up[0] == pytest.approx(stats.norm.sf(upper[0] - mean[0]), abs=1e-12)


def test_spending_boundaries_spend_what_the_function_says():
    """Under θ = 0 the exits above the boundaries are a(t_k) - a(t_{k-1}), checked through scipy's MVN on the
    first two looks (independent) and through the recursion's own crossing on all of them."""
    fractions = [0.3, 0.55, 0.8, 1.0]
    for family in ("obf", "pocock"):
        b = spending_bounds(fractions, 0.025, family)
        up, _ = crossing(fractions, [-math.inf] * 4, b)
        cumulative = [spent(t, 0.025, family) for t in fractions]
        assert np.cumsum(up) == pytest.approx(cumulative, abs=1e-7)
        corr = math.sqrt(fractions[0] / fractions[1])
        two = 1 - stats.multivariate_normal([0, 0], [[1, corr], [corr, 1]]).cdf(b[:2])
        assert two == pytest.approx(cumulative[1], abs=2e-6)
    assert spent(1.0, 0.025, "obf") == pytest.approx(0.025, rel=1e-12) and spent(0.0, 0.025, "pocock") == 0.0


def test_the_remembered_boundary_is_the_computed_one():
    fractions = (0.25, 0.5, 0.75, 1.0)
    want = spending_bounds(fractions, 0.025, "obf")
    assert [boundary(0.025, "obf", fractions[:k]) for k in range(1, 5)] == pytest.approx(want, abs=1e-12)
    assert boundary(0.025, "obf", (0.25, 0.6)) == pytest.approx(spending_bounds([0.25, 0.6], 0.025)[1], abs=1e-12)


def test_bad_fractions_and_families_are_refused():
    with pytest.raises(EvidenceError, match="increasing"):
        spending_bounds([0.5, 0.5], 0.025)
    with pytest.raises(EvidenceError, match="spending 'linear': one of obf, pocock"):
        Spending(0.025, "linear")
    with pytest.raises(EvidenceError, match="between 0 and 1"):
        Spending(1.5)
