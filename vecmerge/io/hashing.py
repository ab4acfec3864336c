"""sha256 of the files vecmerge reads and writes: whole files, and streams hashed on a second thread.

``BackgroundSha256`` hashes pieces on a thread while the caller reads the next one (hashlib releases the
GIL on large buffers), so a file is hashed in the very pass that reads it: the sha256 a manifest records
is that of the bytes used. Standard library only (the recipe and the manifest import it without torch).
"""

from __future__ import annotations

import hashlib
import queue
import threading
from pathlib import Path

from .files import open_regular

HASH_CHUNK = 1 << 22  # bytes read at a time by sha256_file


class BackgroundSha256:
    """sha256 of a stream whose pieces are hashed by a thread (hashlib releases the GIL on large buffers).

    ``update`` queues a buffer, which the caller must never modify afterwards (tensors read from a file
    share its memory: compute on copies); ``hexdigest`` waits for the rest.
    """

    def __init__(self, head: bytes = b""):
        self._h = hashlib.sha256(head)
        self._q: queue.Queue = queue.Queue(maxsize=4)
        self._thread: threading.Thread | None = None

    def _drain(self) -> None:
        while (item := self._q.get()) is not None:
            self._h.update(item)

    def update(self, buf) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._drain, name="vecmerge-sha256", daemon=True)
            self._thread.start()
        self._q.put(buf)

    def stop(self) -> None:
        if self._thread is not None:
            self._q.put(None)
            self._thread.join()
            self._thread = None

    def hexdigest(self) -> str:
        self.stop()
        return self._h.hexdigest()


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file, read in 4 MiB chunks."""
    h = hashlib.sha256()
    with open_regular(path) as f:
        for chunk in iter(lambda: f.read(HASH_CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()
