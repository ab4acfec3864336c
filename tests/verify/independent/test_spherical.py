"""verify's own spherical merges, Model Stock and KnOTS on factored updates, against dense references.

The references work on the dense updates ``B A``: mergekit 0.1.5's own ``nuslerp`` and ``karcher_merge_tensors``
(skipped without mergekit), and for Multi-SLERP, Model Stock and KnOTS their formulas written out here in torch
(mergekit's Multi-SLERP and Model Stock are merge-method objects on full weights). Tolerance rel 1e-10: the
coefficients come from Grams of the factors, the references from the dense entries.
"""

import math

import numpy as np
import pytest
import torch

from vecmerge.verify.independent.draws import module_seed
from vecmerge.verify.independent.merges import merged
from vecmerge.verify.independent.spherical import karcher, model_stock, multislerp, nuslerp
from vecmerge.verify.independent.stack import Stack

merge_utils = pytest.importorskip("peft.utils.merge_utils")


def stacks(n=3, out=9, inn=11, r=3, seed=0) -> list[Stack]:
    g = np.random.default_rng(seed)
    return [Stack(g.standard_normal((out, r)), g.standard_normal((r, inn)) * (1 + i)) for i in range(n)]


def dense(xs) -> list[torch.Tensor]:
    return [torch.from_numpy(x.B @ x.A) for x in xs]


def rel(got: Stack, want) -> float:
    want = np.asarray(want)
    return float(np.linalg.norm(got.B @ got.A - want) / np.linalg.norm(want))


@pytest.mark.parametrize("flatten, row_wise", [(True, False), (False, False), (False, True)])
def test_nuslerp_equals_mergekits(flatten, row_wise):
    mk = pytest.importorskip("mergekit.merge_methods.nuslerp")
    xs = stacks(2)
    v0, v1 = dense(xs)
    want = mk.nuslerp(0.9 / 1.2, v0, v1, dim=0 if row_wise else -1, flatten=flatten)
    assert rel(nuslerp(xs, [0.3, 0.9], flatten, row_wise), want.numpy()) <= 1e-10


@pytest.mark.parametrize("n", [2, 3])
def test_karcher_equals_mergekits(n):
    mk = pytest.importorskip("mergekit.merge_methods.karcher")
    xs = stacks(n)
    want = mk.karcher_merge_tensors(dense(xs), [1.0 / n] * n, 10, 1e-5)
    assert rel(karcher(xs, 10, 1e-5), want.numpy()) <= 1e-10


@pytest.mark.parametrize("normalize", [True, False])
def test_multislerp_equals_its_formula(normalize):
    xs, w = stacks(3), torch.tensor([0.2, 0.5, 0.3], dtype=torch.float64)
    X = torch.stack(dense(xs)).reshape(3, -1)
    wn = w / w.sum() if normalize else w
    norms = X.norm(dim=1, keepdim=True)
    unit = X / (norms + 1e-8)
    mean = (unit * wn[:, None]).sum(0)
    mean = mean / mean.norm()
    g = ((unit - (unit @ mean)[:, None] * mean) * wn[:, None]).sum(0)
    gn = g.norm() + 1e-8
    want = (mean * torch.cos(gn) + g * torch.sin(gn) / gn) * (norms[:, 0] * wn).sum()
    assert rel(multislerp(xs, w.tolist(), normalize, 1e-8), want.reshape(9, 11).numpy()) <= 1e-10


@pytest.mark.parametrize("filter_wise", [False, True])
def test_model_stock_equals_its_formula(filter_wise):
    xs = stacks(3)
    X = torch.stack(dense(xs))
    flat = X if filter_wise else X.reshape(3, 1, -1)  # per output row, or the whole update
    unit = flat / flat.norm(dim=-1, keepdim=True)
    cos = torch.stack([(unit[i] * unit[j]).sum(-1) for i, j in ((0, 1), (0, 2), (1, 2))]).mean(0)
    t = 3 * cos / (1 + 2 * cos)
    want = (t[:, None] if filter_wise else t) * X.mean(0)
    assert rel(model_stock(xs, filter_wise), want.numpy()) <= 1e-10


@pytest.mark.parametrize("how", ["linear", "ties", "dare_ties"])
def test_knots_equals_ties_on_the_joint_singular_basis(how):
    xs, w, m = stacks(2), [0.6, 1.1], "model.layers.0.q_proj"
    D = dense(xs)
    U, S, Vh = torch.linalg.svd(torch.cat(D, 1), full_matrices=False)
    k = int((S > 1e-12 * S[0]).sum())
    R = [S[:k, None] * Vh[:k, i * 11:(i + 1) * 11] for i in range(2)]
    if how == "linear":
        got, want, tol = merged("knots", m, xs, w, [1.0, 1.0], {"knots_merge": how}), sum(
            wi * r for wi, r in zip(w, R)), 1e-10
    elif how == "ties":
        got, want, tol = merged("knots", m, xs, w, [0.5, 0.5], {"knots_merge": how}), merge_utils.ties(
            R, torch.tensor(w, dtype=torch.float64), 0.5), 1e-10
    else:
        torch.manual_seed(module_seed(3, m))  # PEFT draws from the global generator in the tasks' dtype (float32)
        want = merge_utils.dare_ties([r.float() for r in R], torch.tensor(w), 0.5).double()
        got, tol = merged("knots", m, xs, w, [0.5, 0.5], {"knots_merge": how, "seed": 3}), 1e-6
    assert rel(got, (U[:, :k] @ want).numpy()) <= tol
    if how == "linear":  # KnOTS-linear is task arithmetic itself
        assert rel(got, (w[0] * D[0] + w[1] * D[1]).numpy()) <= 1e-10


def test_core_space_ties_is_ties_on_the_principal_cores():
    xs, w, m = stacks(2), [1.0, 0.8], "m"
    D = dense(xs)
    U = torch.linalg.svd(torch.cat(D, 1), full_matrices=False)[0][:, :6]   # rank 3 + 3
    V = torch.linalg.svd(torch.cat(D, 0), full_matrices=False)[2][:6].T
    want = U @ merge_utils.ties([U.T @ d @ V for d in D], torch.tensor(w, dtype=torch.float64), 0.5) @ V.T
    got = merged("ties", m, xs, w, [0.5, 0.5], {"space": "core"})
    assert rel(got, want.numpy()) <= 1e-10
    full = merged("ties", m, xs, w, [0.5, 0.5], {"space": "full"})  # the dense update's ties differs
    assert rel(full, want.numpy()) > 1e-3 and math.isfinite(rel(full, want.numpy()))
