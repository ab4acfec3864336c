"""Writing safetensors files as streams: the header first, then each tensor's bytes, by a background thread.

``SafetensorsWriter`` writes the header from every (name, dtype, shape) known up front, then each tensor's
bytes in that order, handed to a thread that writes and hashes them while the caller computes the next
tensor; ``write_index`` writes a sharded model's ``model.safetensors.index.json``. The files load with the
``safetensors`` library (``tests/test_modelfiles.py``).
"""

from __future__ import annotations

import hashlib
import json
import math
import queue
import threading
from pathlib import Path

import numpy as np
import torch

from .modelfiles import ModelError, itemsize


def tensor_bytes(t: torch.Tensor):
    """A buffer over a tensor's bytes (no copy for a contiguous CPU tensor)."""
    t = t.detach().to("cpu").contiguous()
    return t.reshape(-1).view(torch.uint8).numpy() if t.numel() else b""


class SafetensorsWriter:
    """Stream one safetensors file: the header from ``entries``, then ``write`` each tensor in that order.

    Args:
        path (Path): the file to create. entries (list[tuple[str, str, tuple]]): (name, dtype code, shape)
            in the order the tensors will be written. metadata (dict[str, str] | None): ``__metadata__``.
    """

    def __init__(self, path, entries, metadata: dict | None = None):
        self.path, self._order, self._next = Path(path), [], 0
        header, off = {}, 0
        for name, code, shape in entries:
            n = math.prod(shape) * itemsize(code)
            header[name] = {"dtype": code, "shape": list(shape), "data_offsets": [off, off + n]}
            self._order.append((name, n))
            off += n
        if metadata:
            header = {"__metadata__": dict(metadata), **header}
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)
        self.total_bytes = off
        self._f = open(self.path, "xb")
        head = len(raw).to_bytes(8, "little") + raw
        self._f.write(head)
        self._sha = hashlib.sha256(head)
        self._q: queue.Queue = queue.Queue(maxsize=2)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._drain, daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        while True:
            item = self._q.get()
            if item is None:
                return
            if self._error is None:
                try:
                    self._f.write(item)
                    self._sha.update(item)
                except BaseException as e:  # noqa: BLE001 (re-raised in the caller's thread)
                    self._error = e

    def write(self, name: str, data) -> None:
        """Queue the bytes of ``name``: a tensor, a bytes-like, or an iterable of bytes-likes (its pieces)."""
        if self._error is not None:
            raise self._error
        if self._next >= len(self._order) or self._order[self._next][0] != name:
            want = self._order[self._next][0] if self._next < len(self._order) else "nothing more"
            raise ModelError(f"{self.path}: wrote {name}, expected {want} (internal order error)")
        if isinstance(data, torch.Tensor):
            data = [tensor_bytes(data)]
        elif isinstance(data, (bytes, bytearray, memoryview, np.ndarray)):
            data = [data]
        n = 0
        for buf in data:
            n += memoryview(buf).nbytes
            if n > self._order[self._next][1]:
                break
            self._q.put(buf)
            if self._error is not None:
                raise self._error
        if n != self._order[self._next][1]:
            raise ModelError(f"{self.path}: {name} has {n}+ bytes, its header says {self._order[self._next][1]} "
                             "(internal size error)")
        self._next += 1

    def close(self) -> None:
        """Wait for the writes, check that every tensor was written, close the file."""
        self._q.put(None)
        self._thread.join()
        self._f.close()
        if self._error is not None:
            raise self._error
        if self._next != len(self._order):
            raise ModelError(f"{self.path}: {len(self._order) - self._next} tensors were not written (internal)")

    def sha256(self) -> str:
        """The written file's sha256 (after ``close``)."""
        return self._sha.hexdigest()

    def abort(self) -> None:
        """Stop the writer thread after an error (the caller's transaction removes the file)."""
        self._error = self._error or ModelError("aborted")
        self._q.put(None)
        self._thread.join()
        self._f.close()


def write_index(path, weight_map: dict, total_size: int) -> None:
    """``model.safetensors.index.json``: ``{"metadata": {"total_size"}, "weight_map": {tensor: shard}}``."""
    data = {"metadata": {"total_size": int(total_size)}, "weight_map": dict(sorted(weight_map.items()))}
    Path(path).write_text(json.dumps(data, indent=2) + "\n")
