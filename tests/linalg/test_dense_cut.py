"""dense_cut: one module's cut against a dense float64 SVD (torch.linalg.svd on the same matrix).

Tolerances:
- the dropped energy the cut reports equals ``||D - U S Vh||_F^2`` formed densely: rel 1e-9 (float64);
- full-SVD path: the cut's error equals the optimal (Eckart-Young) one: rel 1e-9;
- randomized path: the error is at most 1% above the optimal (randsvd's measured bound) and never below it
  (up to 1e-9: it cannot beat the optimum);
- energy:E: the rank is the minimal one from the full spectrum where certified, and the certified bracket
  ``[rank_lower_bound, rank]`` always holds it;
- auto: on ``low rank r + iid noise`` with singular values well above the noise edge, the rank is r and
  sigma is the noise's standard deviation within 5%.
"""

from __future__ import annotations

import math

import pytest
import torch

from vecmerge.errors import RecipeError
from vecmerge.linalg.dense_cut import auto_rank, cut_module, gavish_donoho, power_iters_for
from vecmerge.linalg.rank_policy import RankPolicy

F64 = torch.float64


def low_rank_plus_noise(m=300, n=200, r=6, noise=0.01, seed=0, decay=0.7):
    g = torch.Generator().manual_seed(seed)
    U = torch.linalg.qr(torch.randn(m, r, generator=g, dtype=F64)).Q
    V = torch.linalg.qr(torch.randn(n, r, generator=g, dtype=F64)).Q
    s = torch.tensor([decay**i for i in range(r)], dtype=F64) * 3.0
    return (U * s) @ V.T + noise * torch.randn(m, n, generator=g, dtype=F64)


def dense_error_sq(D, c) -> float:
    W = (c.svd.U * c.svd.S) @ c.svd.Vh
    return float(((D - W) ** 2).sum())


def optimal_sq(D, k) -> float:
    S = torch.linalg.svdvals(D)
    return float((S[k:] ** 2).sum())


@pytest.mark.parametrize("shape,k,method", [((300, 200), 8, "randomized"), ((60, 40), 8, "full"),
                                            ((200, 300), 30, "randomized"), ((300, 200), 200, "full")])
def test_fixed_rank_is_the_eckart_young_cut_with_the_exact_error(shape, k, method):
    D = low_rank_plus_noise(*shape, r=12, noise=0.02)
    c = cut_module(D, RankPolicy.parse_extract(str(k)))
    assert c.svd.method == method and c.rank == min(k, *shape)
    assert c.svd.dropped_energy == pytest.approx(dense_error_sq(D, c), rel=1e-9, abs=1e-20)
    assert c.svd.total_energy == pytest.approx(float((D * D).sum()), rel=1e-12)
    opt = optimal_sq(D, c.rank)
    if method == "full":
        assert c.svd.dropped_energy == pytest.approx(opt, rel=1e-9, abs=1e-20)
    else:
        assert math.sqrt(opt) * (1 - 1e-9) <= c.svd.error <= 1.01 * math.sqrt(opt)
        assert c.power_iters == power_iters_for(k, *shape)


def test_power_iterations_rule():
    assert power_iters_for(16, 128, 4096) == 2 and power_iters_for(17, 128, 4096) == 3


@pytest.mark.parametrize("shape", [(300, 200), (40, 30), (1000, 120)])
@pytest.mark.parametrize("energy", [0.5, 0.9, 0.99])
def test_energy_rank_is_minimal_or_bracketed(shape, energy):
    D = low_rank_plus_noise(*shape, r=10, noise=0.05, decay=0.8)
    c = cut_module(D, RankPolicy.parse_extract(f"energy:{energy}"))
    S2 = torch.linalg.svdvals(D) ** 2
    minimal = int((torch.cumsum(S2, 0) < (energy - 1e-12) * S2.sum()).sum()) + 1
    assert c.svd.captured_share >= energy - 1e-12
    assert c.rank_lower_bound <= minimal <= c.rank
    if c.minimal:
        assert c.rank == minimal
    if c.svd.method == "full":
        assert c.minimal and c.rank == minimal


def test_energy_rank_certified_minimal_on_the_randomized_path():
    D = low_rank_plus_noise(400, 300, r=5, noise=0.001)
    c = cut_module(D, RankPolicy.parse_extract("energy:0.9"))
    assert c.svd.method == "randomized" and c.minimal


def test_auto_recovers_the_rank_of_low_rank_plus_noise():
    sigma = 0.01
    D = low_rank_plus_noise(600, 400, r=6, noise=sigma, decay=0.8)
    c = cut_module(D, RankPolicy.parse_extract("auto"))
    assert c.rank == 6
    assert c.sigma == pytest.approx(sigma, rel=0.05)
    m, n = 400, 600
    assert c.threshold == pytest.approx(gavish_donoho(m / n) * math.sqrt(n) * c.sigma, rel=1e-12)


def test_auto_on_pure_noise_keeps_nothing_and_on_exact_low_rank_keeps_the_rank():
    g = torch.Generator().manual_seed(3)
    assert cut_module(torch.randn(300, 200, generator=g, dtype=F64), RankPolicy("auto")).rank == 0
    exact = low_rank_plus_noise(300, 200, r=4, noise=0.0)
    assert cut_module(exact, RankPolicy("auto")).rank == 4
    assert cut_module(torch.zeros(50, 40, dtype=F64), RankPolicy("auto")).rank == 0


def test_auto_rank_rule_on_a_known_spectrum():
    # m = n = 100, beta = 1: tau = 4/sqrt(3) * 10 * sigma; sigma from the energy left beyond r
    S = torch.tensor([50.0, 30.0] + [1.0] * 98, dtype=F64)
    total = float((S**2).sum())
    r, sigma, tau = auto_rank(S, total, 100, 100)
    assert r == 2
    assert sigma == pytest.approx(math.sqrt(98 / (98 * 98)), rel=1e-12)
    assert tau == pytest.approx(4 / math.sqrt(3) * 10 * sigma, rel=1e-12)


def test_gavish_donoho_square_constant():
    assert gavish_donoho(1.0) == pytest.approx(4 / math.sqrt(3), rel=1e-12)


def test_zero_difference_cuts_to_rank_zero():
    Z = torch.zeros(300, 200, dtype=F64)
    for rank in ("energy:0.9", "auto"):
        c = cut_module(Z, RankPolicy.parse_extract(rank))
        assert c.rank == 0 and c.svd.dropped_energy == 0.0


@pytest.mark.parametrize("bad", ["0", "exact", "energy:0", "energy:1.5", "keep-base", "auto:3", ""])
def test_bad_rank_is_refused(bad):
    with pytest.raises(RecipeError, match="--rank"):
        RankPolicy.parse_extract(bad)


def test_nan_difference_is_refused():
    D = torch.zeros(10, 10, dtype=F64)
    D[0, 0] = float("nan")
    with pytest.raises(RecipeError, match="NaN"):
        cut_module(D, RankPolicy("fixed", 2))
