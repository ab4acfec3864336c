"""The block-by-block element-wise merges against ``merge_kernels`` (themselves bit-identical to PEFT's).

In one block the result is bit-identical (``torch.equal``); in many blocks the same entries survive
(identical zero pattern, including ties at the magnitude threshold, kept by lowest flat index across
blocks) and the values agree to 4 units of round-off of the summands, ``4 eps sum_i |w_i| max|X|`` (a sum
over tasks may be ordered differently by torch on a smaller tensor).
"""

from __future__ import annotations

import pytest
import torch

from vecmerge.errors import MergeArgumentError
from vecmerge.linalg.merge_kernels import dare_linear, dare_ties, magnitude_prune, ties
from vecmerge.linalg.streamed import block_rows, streamed_merge

W = [0.7, -0.4, 1.3, 0.5, 2.0]
DENS = [0.5, 0.3, 0.9, 1.0, 0.2]


def kernel(drop, combine, X, w, d, seed):
    g = torch.Generator().manual_seed(seed)
    if drop == "magnitude":
        return ties(X, w, d) if combine == "ties" else magnitude_prune(X, w, d)
    return dare_ties(X, w, d, g, mask_dtype=torch.float32) if combine == "ties" else \
        dare_linear(X, w, d, g, mask_dtype=torch.float32)


def streamed(drop, combine, X, w, d, seed, rows):
    g = torch.Generator().manual_seed(seed)
    return streamed_merge(lambda i, r0, r1: X[i, r0:r1], X.shape[0], tuple(X.shape[1:]), w, d, drop, combine,
                          generator=g, mask_dtype=torch.float32, rows_per_block=rows, dtype=X.dtype)


@pytest.mark.parametrize("drop", ["magnitude", "random"])
@pytest.mark.parametrize("combine", ["sum", "ties"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_one_block_is_bit_identical_and_many_blocks_agree(drop, combine, dtype):
    g = torch.Generator().manual_seed(3)
    X = torch.randn(5, 37, 23, generator=g, dtype=dtype)
    ref = kernel(drop, combine, X, W, DENS, 9)
    assert torch.equal(streamed(drop, combine, X, W, DENS, 9, 37), ref)
    for rows in (1, 4, 10):
        got = streamed(drop, combine, X, W, DENS, 9, rows)
        assert torch.equal(got == 0, ref == 0)
        scale = sum(abs(w) for w in W) * float(X.abs().max()) / min(DENS)
        torch.testing.assert_close(got, ref, rtol=0, atol=4 * torch.finfo(dtype).eps * scale)


def test_ties_at_the_threshold_are_kept_by_flat_index_across_blocks():
    X = torch.tensor([[[1.0, -2.0, 2.0], [2.0, 3.0, -2.0], [2.0, 0.5, 1.0]]], dtype=torch.float64)  # 1 task
    for rows in (1, 2, 3):  # k = int(0.5 * 9) = 4: the 3 and the first 3 of the five 2s
        got = streamed("magnitude", "sum", X, [1.0], 0.5, 0, rows)
        want = torch.tensor([[0.0, -2.0, 2.0], [2.0, 3.0, 0.0], [0.0, 0.0, 0.0]], dtype=torch.float64)
        assert torch.equal(got, want)
        assert torch.equal(got, magnitude_prune(X, [1.0], 0.5))


def test_block_rows_and_refusals():
    assert block_rows(3, 1024) * 3 * 1024 * 8 <= 32 * 2**20 and block_rows(1, 10**9) == 1
    X = torch.ones(2, 4, 4, dtype=torch.float64)
    for kw, want in (({"density": 0.0}, "outside"), ({"drop": "dare"}, "use one of"), ({"w": [1.0]}, "weights")):
        args = {"w": [1.0, 1.0], "density": 0.5, "drop": "magnitude", **kw}
        with pytest.raises(MergeArgumentError, match=want):
            streamed_merge(lambda i, r0, r1: X[i, r0:r1], 2, (4, 4), args["w"], args["density"], args["drop"], "sum")
    X[1, 2, 2] = float("nan")
    with pytest.raises(MergeArgumentError, match="non-finite"):
        streamed_merge(lambda i, r0, r1: X[i, r0:r1], 2, (4, 4), [1.0, 1.0], 0.5, "magnitude", "sum")
    with pytest.raises(MergeArgumentError, match="Generator"):
        streamed_merge(lambda i, r0, r1: X[i, r0:r1], 2, (4, 4), [1.0, 1.0], 0.5, "random", "sum")
