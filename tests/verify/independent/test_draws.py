"""verify's numpy re-draw of torch's CPU Bernoulli stream: bit-identical masks to ``torch.bernoulli`` (exact)."""

import numpy as np
import pytest
import torch

from vecmerge.linalg.merge_kernels import module_seed as pipeline_seed
from vecmerge.verify.independent.draws import Stream, module_seed


@pytest.mark.parametrize("seed, module", [(0, "a"), (7, "model.layers.1.self_attn.v_proj"), (2**40 + 3, "x.y")])
def test_module_seed_is_the_pipelines(seed, module):
    assert module_seed(seed, module) == pipeline_seed(seed, module)


@pytest.mark.parametrize("seed", [0, 12345, 2**62 + 987654321])  # a 63-bit seed: only its low 32 bits seed MT19937
def test_masks_equal_torch_bernoulli_call_after_call(seed):
    g, s = torch.Generator().manual_seed(seed), Stream(seed)
    for shape, d in [((13, 29), 0.3), ((5, 7), 0.9), ((64, 48), 0.5)]:  # consecutive calls continue the stream
        want = torch.bernoulli(torch.full(shape, d, dtype=torch.float32), generator=g).bool().numpy()
        got = s.bernoulli(np.full(shape, d))
        assert got.shape == shape and (got == want).all()
    p = torch.rand(40, 17, generator=torch.Generator().manual_seed(1))  # varying float32 probabilities (DELLA)
    assert (s.bernoulli(p.numpy()) == torch.bernoulli(p, generator=g).bool().numpy()).all()


def test_another_seed_gives_another_mask():
    a, b = Stream(1).bernoulli(np.full((32, 32), 0.5)), Stream(2).bernoulli(np.full((32, 32), 0.5))
    assert (a != b).mean() > 0.3
