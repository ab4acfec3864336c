"""How the factored kernels run: single-threaded, module after module.

Each module's work is a few small LAPACK calls (QR of out x R stacks, SVDs of R x R cores). Threading
*inside* such calls is a trap: on this project's 2-core machines a 3072 x 128 float64 QR takes 15 ms
on one thread and over 300 ms on two (MKL), and running modules on a thread pool gained nothing
measurable. So the kernels run on one intra-op thread for the duration of a pipeline, and the
previous setting is restored afterwards (the CLI also defaults OMP/MKL threads to 1).
"""

from __future__ import annotations

import contextlib

import torch


@contextlib.contextmanager
def single_threaded_kernels():
    """Run torch kernels on one intra-op thread inside the block, restoring the setting after."""
    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(prev)


def map_modules(fn, names: list[str], progress=None) -> dict:
    """``{m: fn(m) for m in names}`` with single-threaded kernels and an optional progress bar.

    Args:
        fn (callable): module name -> result.
        names (list[str]): modules, in the order the result keeps.
        progress: optional callable wrapping an iterable (a tqdm bar).
    """
    with single_threaded_kernels():
        return {m: fn(m) for m in (progress(names) if progress else names)}
