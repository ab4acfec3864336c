"""One ``verify`` call's file digests: each file hashed once per call, not once per check.

``one_call()`` opens a cache for the checks it wraps; ``digest(path, compute)`` returns the sha256 another check
of the same call computed for that very file, else ``compute()`` (and remembers it). The key is the file's
resolved path, device, inode, size and modification time (ns), taken before and after the computation: a file
replaced or written in between is hashed again, and a digest whose file moved while it was computed is not kept.
Outside ``one_call()`` nothing is cached (every call computes).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path

_CACHE: ContextVar[dict | None] = ContextVar("vecmerge_verify_digests", default=None)


def _key(path: Path) -> tuple:
    st = os.stat(path)
    return str(Path(path).resolve()), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


@contextmanager
def one_call() -> Iterator[None]:
    """Cache digests for the checks run inside (one ``verify`` call); dropped on exit."""
    token = _CACHE.set({})
    try:
        yield
    finally:
        _CACHE.reset(token)


def digest(path: Path, compute: Callable[[], str]) -> str:
    """``path``'s sha256: the one this call already computed for the same file (same key), else ``compute()``.

    Args:
        path (Path): the file hashed. compute (Callable[[], str]): hashes it (hex sha256).
    """
    cache = _CACHE.get()
    if cache is None:
        return compute()
    try:
        key = _key(path)
    except OSError:
        return compute()
    if key in cache:
        return cache[key]
    value = compute()
    try:
        if _key(path) == key:
            cache[key] = value
    except OSError:
        pass
    return value
