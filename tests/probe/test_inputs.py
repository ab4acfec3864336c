"""probe/inputs.py: rows kept exactly, a float64 Gram beyond the width, a Frequent Directions sketch when wide."""

from __future__ import annotations

import torch

from vecmerge.probe.inputs import Inputs


def _rows(n, width, seed=0, decay=0.7):
    g = torch.Generator().manual_seed(seed)
    scale = decay ** torch.arange(width, dtype=torch.float64)  # a decaying spectrum, as layer inputs have
    return (torch.randn(n, width, generator=g, dtype=torch.float64) * scale).float()


def test_rows_are_kept_until_the_width_then_an_exact_gram():
    """n <= in: the rows themselves (F^T F = X^T X); past in: a float64 Gram equal to X^T X (1e-12 relative)."""
    X = _rows(11, 8)
    inp = Inputs(8)
    inp.add(X[:5])
    inp.add(X[5:8])
    assert inp.kind == "rows" and torch.equal(inp.factor(), X[:8].double())
    inp.add(X[8:])
    want = X.double().T @ X.double()
    assert inp.kind == "gram" and inp.factor() is None and inp.n == 11
    assert float((inp.gram() - want).norm()) <= 1e-12 * float(want.norm())
    assert abs(inp.trace - torch.trace(want).item()) <= 1e-12 * inp.trace
    assert inp.bound == 0.0 and inp.describe()["form"] == "gram"


def test_a_wide_input_is_sketched_within_its_recorded_bound_whatever_the_batches():
    """0 <= X^T X - B^T B <= delta I (eigenvalues, 1e-9 of the trace), delta <= (||X||^2 - ||B||^2) / (l + 1),
    the first 2 l rows exact, and the sketch the same however the rows were split into batches (1e-12)."""
    X = _rows(70, 24, seed=1)
    one = Inputs(24, sketch_rows=4, exact_width=16)
    one.add(X[:8])
    assert one.kind == "rows"  # 2 l = 8 rows: still exact
    one.add(X[8:])
    other = Inputs(24, sketch_rows=4, exact_width=16)
    for a, b in ((0, 3), (3, 20), (20, 21), (21, 70)):
        other.add(X[a:b])
    assert one.kind == "sketch" and one.factor().shape == (6, 24)  # l rows shrunk, then 2 more of the buffer
    assert float((one.factor() - other.factor()).norm()) <= 1e-12 * float(one.factor().norm())
    G = X.double().T @ X.double()
    gap = torch.linalg.eigvalsh(G - one.gram())
    tr = float(torch.trace(G))
    assert float(gap.min()) >= -1e-9 * tr and float(gap.max()) <= one.delta + 1e-9 * tr
    assert 0.0 < one.delta <= (tr - float(one.factor().norm()) ** 2) / 5 * (1 + 1e-9)
    assert one.bound == one.delta / one.trace and one.describe()["sketch_rows"] == 4
    assert abs(one.trace - tr) <= 1e-9 * tr


def test_memory_is_the_rows_then_the_gram():
    """nbytes: n x in float32 while rows, in x in float64 after."""
    inp = Inputs(16)
    inp.add(_rows(10, 16))
    assert inp.nbytes() == 10 * 16 * 4
    inp.add(_rows(10, 16, seed=2))
    assert inp.nbytes() == 16 * 16 * 8
