"""How the factored kernels run: single-threaded kernels, modules spread over a few worker threads.

Each module's work is a few small LAPACK calls (QR of out x R stacks, SVDs of R x R cores). Threading
*inside* such calls is a trap: on this project's 2-core machines a 3072 x 128 float64 QR takes 15 ms
on one thread and over 300 ms on two (MKL). So every kernel runs on one intra-op thread, and the
modules are spread over ``workers()`` Python threads instead (torch releases the GIL inside its
kernels): each module's arithmetic is exactly the same whatever the thread count, so the results are
bit for bit those of one thread. ``VECMERGE_THREADS`` sets the count (default: the usable CPUs, at
most 8); the previous torch setting is restored afterwards (the CLI also defaults OMP/MKL threads to 1).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

MAX_WORKERS = 8
Progress = Callable[..., Iterable[Any]]  # wraps an iterable (a tqdm bar), optionally with ``total=``


def workers() -> int:
    """Worker threads for per-module work: ``VECMERGE_THREADS``, else the usable CPUs (at most 8)."""
    env = os.environ.get("VECMERGE_THREADS", "").strip()
    if env.isdigit() and int(env) >= 1:
        return int(env)
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return max(1, min(cpus, MAX_WORKERS))


@contextlib.contextmanager
def single_threaded_kernels():
    """Run torch kernels on one intra-op thread inside the block, restoring the setting after."""
    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(prev)


def map_modules(fn: Callable[[str], Any], names: list[str], progress: Progress | None = None) -> dict:
    """``{m: fn(m) for m in names}``: single-threaded kernels, modules on ``workers()`` threads, in order.

    Args:
        fn (callable): module name -> result; must not depend on other modules' calls (each runs alone).
        names (list[str]): modules, in the order the result keeps.
        progress: optional callable wrapping an iterable (a tqdm bar), advanced as modules finish.
    """
    names = list(names)
    n = min(workers(), len(names))
    with single_threaded_kernels():
        if n <= 1:
            return {m: fn(m) for m in (progress(names) if progress else names)}

        def one(m):
            torch.set_num_threads(1)  # a new thread may start from the OpenMP default
            return fn(m)

        with ThreadPoolExecutor(max_workers=n, thread_name_prefix="vecmerge") as pool:
            results: Iterable[Any] = pool.map(one, names)
            if progress:
                try:
                    results = progress(results, total=len(names))
                except TypeError:  # a wrapper that takes the iterable only
                    results = progress(results)
            return dict(zip(names, results))
