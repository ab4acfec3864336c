"""Time PEFT's per-module cut (``torch.linalg.svd(full_matrices=True)``) against vecmerge's randomized top-k.

A measurement, not a test: one intra-op thread, Qwen3-0.6B module shapes (3072 x 1024 for the MLP,
1024 x 1024 for attention), float32 and float64, two kinds of matrix:

- ``ties``: the TIES merge (density 0.5) of three rank-16 updates, the matrix PEFT's ``ties_svd`` cuts
  (trimming makes its spectrum flat: the hard case for a randomized range finder);
- ``lowrank+noise``: a rank-16 change plus 1% noise energy, the extraction benchmark's difference.

For each: PEFT's full SVD (time), ``truncated_svd`` at k = 32 and 64 with 2 power iterations (time,
best of 3), and how far the randomized cut's error is above the optimal (Eckart-Young) one from the
full float64 spectrum. Run: ``.venv/bin/python benchmarks/bench_kernels.py`` (about a minute).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
# building blocks measured on their own (internal): the TIES kernel and the randomized SVD
from vecmerge.linalg.merge_kernels import ties
from vecmerge.linalg.randsvd import truncated_svd

SHAPES = [(3072, 1024), (1024, 1024)]
RANKS = [32, 64]


def ties_matrix(rows: int, cols: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    X = torch.stack([torch.randn(rows, 16, generator=g, dtype=torch.float64)
                     @ torch.randn(16, cols, generator=g, dtype=torch.float64) for _ in range(3)])
    return ties(X, [1.0, 1.0, 1.0], 0.5)


def lowrank_noise_matrix(rows: int, cols: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    change = torch.randn(rows, 16, generator=g, dtype=torch.float64) @ torch.randn(16, cols, generator=g,
                                                                                      dtype=torch.float64)
    noise = torch.randn(rows, cols, generator=g, dtype=torch.float64)
    return change + noise * (0.01 * float((change**2).sum()) / float((noise**2).sum())) ** 0.5


def best_of(fn, repeat: int) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def main() -> None:
    torch.set_num_threads(1)
    print("| matrix | shape | dtype | PEFT svd(full_matrices=True) s | k | randomized s | speed-up | "
          "error above optimal | dropped energy exact to |")
    print("|---|---|---|---|---|---|---|---|---|")
    for kind, make in (("ties", ties_matrix), ("lowrank+noise", lowrank_noise_matrix)):
        for rows, cols in SHAPES:
            D64 = make(rows, cols, seed=rows + cols)
            S2 = torch.linalg.svdvals(D64) ** 2
            for dtype in (torch.float32, torch.float64):
                D = D64.to(dtype)
                t_full, _ = best_of(lambda D=D: torch.linalg.svd(D, full_matrices=True), 1)
                for k in RANKS:
                    t_rand, cut = best_of(lambda D=D, k=k: truncated_svd(D, k, power_iters=2, seed=0), 3)
                    opt = float(S2[k:].sum()) ** 0.5
                    direct = float(((D.to(torch.float64) - (cut.U * cut.S) @ cut.Vh) ** 2).sum())
                    exact = abs(cut.dropped_energy - direct) / direct
                    print(f"| {kind} | {rows}x{cols} | {str(dtype)[6:]} | {t_full:.2f} | {k} | {t_rand:.3f} | "
                          f"{t_full / t_rand:.1f}x | {100 * (cut.error / opt - 1):.2f}% | {exact:.0e} |", flush=True)


if __name__ == "__main__":
    main()
