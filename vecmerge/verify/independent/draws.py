"""The random drops of DARE and DELLA re-drawn by numpy: torch's CPU stream written out once more, no torch.

A randomized merge (``dare_linear``, ``dare_ties``, ``della``, ``della_linear``, KnOTS' ``dare_ties``) draws its
keep masks per module from a CPU ``torch.Generator`` seeded with ``module_seed(seed, module)`` (the recipe's
``seed``), one ``torch.bernoulli`` call per model over its whole (rows, cols) task in float32, model after model.
torch's CPU generator is the 32-bit Mersenne Twister (MT19937) seeded by the standard ``init_genrand`` with the
seed's low 32 bits; ``bernoulli(p)`` on a float32 tensor takes one 32-bit draw ``u`` per entry in row-major
order and keeps the entry when ``(u & (2^24 - 1)) * 2^-24 < p`` (ATen's ``uniform_real_distribution<float>`` and
``bernoulli_distribution``). Here the generator's state is made by that ``init_genrand`` and handed to numpy's
own MT19937 (``random_raw``: its 32-bit outputs), so the masks are the pipeline's, bit for bit, without sharing
its code: a pipeline that drew from another seed, another module's stream or in another order gives another
mask, and verify sees a different update. ``tests/verify/independent/test_draws.py`` pins this against torch.
"""

from __future__ import annotations

import hashlib

import numpy as np

STATE_N = 624
LOW24 = (1 << 24) - 1
CHUNK = 1 << 22  # draws per step: bounded memory whatever the task's size


def module_seed(seed: int, module: str) -> int:
    """The pipeline's per-module seed: the first 8 bytes of ``sha256(f"{seed}:{module}")``, little-endian, >> 1."""
    return int.from_bytes(hashlib.sha256(f"{int(seed)}:{module}".encode()).digest()[:8], "little") >> 1


class Stream:
    """torch's CPU generator after ``manual_seed(seed)``, as numpy's MT19937 (see the module docstring).

    Args:
        seed (int): the generator's seed (only its low 32 bits reach MT19937's state, as in torch).
    """

    def __init__(self, seed: int):
        key = np.empty(STATE_N, dtype=np.uint64)
        key[0] = seed & 0xFFFFFFFF
        for j in range(1, STATE_N):  # init_genrand: x_j = 1812433253 (x_{j-1} ^ (x_{j-1} >> 30)) + j  (mod 2^32)
            prev = int(key[j - 1])
            key[j] = (1812433253 * (prev ^ (prev >> 30)) + j) & 0xFFFFFFFF
        self.bits = np.random.MT19937()
        self.bits.state = {"bit_generator": "MT19937", "state": {"key": key.astype(np.uint32), "pos": STATE_N}}

    def bernoulli(self, p: np.ndarray) -> np.ndarray:
        """A bool mask of ``p``'s shape: entry kept when its uniform ``(u & (2^24-1)) 2^-24 < p`` (p as float32).

        Args:
            p (np.ndarray): keep probabilities (float32, or a float cast to it, as torch's float32 tensor).
        """
        p32 = np.asarray(p, dtype=np.float32).reshape(-1)
        out = np.empty(p32.size, dtype=bool)
        for s in range(0, p32.size, CHUNK):
            u = self.bits.random_raw(min(CHUNK, p32.size - s)).astype(np.uint64) & LOW24
            uniform = (u.astype(np.float64) * 2.0 ** -24).astype(np.float32)  # exact: 24 bits fit a float32
            out[s:s + u.size] = uniform < p32[s:s + u.size]
        return out.reshape(np.shape(p))
