"""analysis/protect.py: U by energy, D' on the core of a widened basis, quadratic figures, against dense float64."""

from __future__ import annotations

import pytest
import torch

from vecmerge.analysis.protect import energy_basis, project, quadratic, ratio
from vecmerge.errors import NumericError
from vecmerge.linalg.lowrank import LowRank
from vecmerge.linalg.subspace import Subspace


def _direction(seed: int, shape=(20, 30), ranks=(3, 2)):
    g = torch.Generator().manual_seed(seed)
    terms = [LowRank(torch.randn(shape[0], r, generator=g, dtype=torch.float64),
                     torch.randn(r, shape[1], generator=g, dtype=torch.float64), 0.5) for r in ranks]
    _, cores = Subspace.of(terms, shape)
    return cores[0] - cores[1], terms[0].dense() - terms[1].dense()


def _orthonormal(n: int, c: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.linalg.qr(torch.randn(n, c, generator=g, dtype=torch.float64)).Q


def test_projected_direction_annihilates_span_u_and_matches_dense():
    """D' x = 0 for x in span U (1e-10 of ||D||), and D' = D - D U U^T densely (U mostly outside the basis)."""
    d, dense = _direction(0)
    U = _orthonormal(30, 7, 1)
    pr = project(d, U)
    Dp = pr.direction.dense()
    assert float((Dp @ U).norm()) <= 1e-10 * float(dense.norm())
    ref = dense - (dense @ U) @ U.T
    assert float((Dp - ref).norm()) <= 1e-12 * float(dense.norm())
    assert pr.rank == 7
    assert int(torch.linalg.matrix_rank(Dp)) <= int(torch.linalg.matrix_rank(dense))  # the same rank at most


def test_u_inside_the_basis_needs_no_widening():
    """When U lies in the direction's row space the basis is not widened and D' is still exact."""
    d, dense = _direction(2)
    Vh = torch.linalg.svd(dense, full_matrices=False).Vh
    U = Vh[:2].T.contiguous()
    pr = project(d, U)
    assert pr.space.q == d.space.q
    ref = dense - (dense @ U) @ U.T
    assert float((pr.direction.dense() - ref).norm()) <= 1e-12 * float(dense.norm())


def test_energy_basis_counts_the_fewest_eigenvalues_and_never_beyond_the_exact_rank():
    """E picks the fewest top eigenvectors holding E of the trace; E = 1 gives the inputs' exact rank."""
    g = torch.Generator().manual_seed(3)
    X = torch.randn(3, 12, generator=g, dtype=torch.float64) * torch.tensor([[10.0], [3.0], [1.0]])
    G = X.T @ X
    S = torch.linalg.svdvals(X) ** 2
    share = torch.cumsum(S, 0) / S.sum()
    U1, _ = energy_basis(G, 1.0)
    assert U1.shape[1] == 3  # 12 columns, rank 3: round-off eigenvalues are never protected
    for E in (0.5, float(share[0]) + 1e-6, 0.999):
        U, w = energy_basis(G, E)
        assert U.shape[1] == int((share < E - 1e-12).sum()) + 1
    Ua, _ = energy_basis(G, float(share[1]))  # exactly the first two: E on the boundary counts it reached
    assert Ua.shape[1] == 2
    with pytest.raises(NumericError):
        energy_basis(torch.zeros(4, 4, dtype=torch.float64), 0.9)


def test_quadratic_is_the_squared_norm_of_d_times_the_inputs():
    """||D X^T||_F^2 from the core and the Gram equals the dense product, for D and D'."""
    d, dense = _direction(4)
    g = torch.Generator().manual_seed(5)
    X = torch.randn(9, 30, generator=g, dtype=torch.float64)
    U = _orthonormal(30, 4, 6)
    pr = project(d, U)
    assert quadratic(d, X.T @ X) == pytest.approx(float(((dense @ X.T) ** 2).sum()), rel=1e-12)
    Dp = dense - (dense @ U) @ U.T
    assert quadratic(pr.direction, X.T @ X) == pytest.approx(float(((Dp @ X.T) ** 2).sum()), rel=1e-12)
    assert ratio(1.0, 4.0) == 0.5 and ratio(1.0, 0.0) is None
