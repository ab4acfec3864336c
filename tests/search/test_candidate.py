"""A candidate's factors against a dense float64 reference built here (numpy's eigh, the formulas written out)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from vecmerge.probe.capture import Grams
from vecmerge.probe.inputs import Inputs
from vecmerge.search.candidate import Factors, backbone_updates, build, dense
from vecmerge.search.space import Space, candidate, module_multiplier
from vecmerge.testing import toy_adapter
from vecmerge.workspace.names import Workspace


def _reference_basis(G: np.ndarray, energy: float) -> np.ndarray:
    w, V = np.linalg.eigh(G)
    w, V = w[::-1], V[:, ::-1]
    c = int(np.searchsorted(np.cumsum(w), energy * w.sum() * (1 - 1e-12))) + 1
    return V[:, :c]


def test_a_protected_candidate_is_the_backbone_plus_its_projected_scaled_direction(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name, seed in (("a", 1), ("b", 2), ("c", 3)):
        toy_adapter(tmp_path / name, rank=4, seed=seed)
    ws = Workspace()
    backbone = ws.evaluate("a")
    dirs = [ws.evaluate("b - a"), ws.evaluate("c")]
    gen = torch.Generator().manual_seed(0)
    grams, inputs = {}, {}
    for m, x in backbone.modules.items():
        X = torch.randn(12, x.shape[1], generator=gen, dtype=torch.float64)
        grams[m] = X.T @ X  # rank 12 of the input width: the projection leaves the rest
        inputs[m] = Inputs(x.shape[1])
        inputs[m].add(X.clone())
    factors = Factors(backbone, dirs, Grams({"p": inputs}, {"p": 12}), ["p"])
    space = Space("a", ("b - a", "c"), tuple(backbone.modules), 0.05, (("p", "p.jsonl"),), types=True, depth=True)
    c = candidate(space, {"trust": 0.04, "w0": 0.7, "w1": 0.3, "energy": 0.9, "slope": 0.5, "mix": 0.4})
    ours = dense(c, factors)

    A = {m: x.dense().numpy() for m, x in backbone.modules.items()}
    D = {m: 0.7 * (ws.evaluate("b").modules[m].dense().numpy() - A[m]) + 0.3 * dirs[1].modules[m].dense().numpy()
         for m in A}
    Dp = {}
    for m in A:
        f = module_multiplier(m, 2, 0.5, 0.4)
        U = _reference_basis(grams[m].numpy(), 0.9)
        Dp[m] = f * D[m] - (f * D[m] @ U) @ U.T
        assert np.abs(Dp[m] @ U).max() <= 1e-10 * np.abs(Dp[m]).max() + 1e-300  # D' x = 0 on span U
    alpha = 0.04 * math.sqrt(sum((x ** 2).sum() for x in A.values())) / math.sqrt(sum((x ** 2).sum()
                                                                                      for x in Dp.values()))
    for m in A:
        want = A[m] + alpha * Dp[m]
        assert np.abs(ours[m].numpy() - want).max() <= 1e-8 * np.abs(want).max(), m  # rows SVD vs Gram eigh
    built = build(c, factors, dtype=torch.float64)
    assert built.step == pytest.approx(0.04, rel=1e-12)  # ||alpha D'|| / ||backbone|| = t
    assert built.alpha == pytest.approx(alpha, rel=1e-8)
    plain = math.sqrt(sum(((module_multiplier(m, 2, 0.5, 0.4) * D[m]) ** 2).sum() for m in A))
    assert abs(built.kept_direction - math.sqrt(sum((x ** 2).sum() for x in Dp.values())) / plain) < 1e-8
    # the backbone alone as hooks: the same factors, the scale folded into B
    bb = backbone_updates(factors, dtype=torch.float64)
    for m, u in bb.items():
        assert torch.allclose(u.B @ u.A, torch.from_numpy(A[m]), rtol=0, atol=1e-12)
