"""Writing safetensors files as streams: the header first, then each tensor's bytes, by a background thread.

``SafetensorsWriter`` writes the header from every (name, dtype, shape) known up front, then each tensor's
bytes in that order, written and hashed by a thread. ``SafetensorsStream`` reserves the header's room from
shape bounds, takes tensors as they come, and writes the exact header, space-padded, at the end.
``write_index`` writes ``model.safetensors.index.json``. No non-finite value is ever written:
``SafetensorsWriter.write`` checks every floating tensor's bytes (``nonfinite``, by bit mask) and refuses NaN
or Inf with a NumericError naming it. More: docs/design/io.md.
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

from ..errors import ModelError, NumericError
from .safetensors_read import DTYPE_CODES, itemsize


def tensor_bytes(t: torch.Tensor):
    """A buffer over a tensor's bytes (no copy for a contiguous CPU tensor)."""
    t = t.detach().to("cpu").contiguous()
    return t.reshape(-1).view(torch.uint8).numpy() if t.numel() else b""


# dtype code -> (unsigned view, exponent mask): a value is NaN or Inf exactly when its exponent bits are all ones
# (F8_E4M3, "fn", has no Inf and one NaN pattern per sign: S.1111.111)
NONFINITE_MASKS = {"F64": (np.uint64, 0x7FF0000000000000), "F32": (np.uint32, 0x7F800000),
                   "F16": (np.uint16, 0x7C00), "BF16": (np.uint16, 0x7F80), "F8_E5M2": (np.uint8, 0x7C),
                   "F8_E4M3": (np.uint8, 0x7F)}


def nonfinite(buf, code: str) -> int:
    """How many NaN or Inf values the bytes ``buf`` of dtype ``code`` hold (0 for a non-floating dtype).

    Args:
        buf (bytes-like): whole values of ``code`` (a length that is a multiple of its size).
        code (str): a safetensors dtype code (``F32``, ``BF16``, ...).
    """
    if code not in NONFINITE_MASKS:
        return 0
    view, mask = NONFINITE_MASKS[code]
    bits = np.frombuffer(memoryview(buf).cast("B"), dtype=view)
    return int(np.count_nonzero((bits & view(mask)) == view(mask)))


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
            self._order.append((name, n, code))
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
        if self._next >= len(self._order) or self._order[self._next][0] != name:  # (name, bytes, dtype code)
            want = self._order[self._next][0] if self._next < len(self._order) else "nothing more"
            raise ModelError(f"{self.path}: wrote {name}, expected {want} (internal order error)")
        if isinstance(data, torch.Tensor):
            data = [tensor_bytes(data)]
        elif isinstance(data, (bytes, bytearray, memoryview, np.ndarray)):
            data = [data]
        _, size, code = self._order[self._next]
        item = itemsize(code)
        n, carry, bad = 0, b"", 0
        for buf in data:
            k = memoryview(buf).nbytes
            n += k
            if n > size:
                break
            if code in NONFINITE_MASKS:  # whole values only: a piece may end inside one
                whole = carry + bytes(memoryview(buf).cast("B")) if carry else buf
                cut = (len(carry) + k) // item * item
                bad += nonfinite(memoryview(whole).cast("B")[:cut], code)
                carry = bytes(memoryview(whole).cast("B")[cut:])
            if bad:
                raise NumericError(f"{self.path.name}: tensor {name} holds {bad}+ NaN/Inf value(s) ({code}); a "
                                   "non-finite weight is never written, nothing written: the inputs hold them or "
                                   "the result overflows its dtype (check the models' weights, or a wider --dtype)")
            self._q.put(buf)
            if self._error is not None:
                raise self._error
        if n != size:
            raise ModelError(f"{self.path}: {name} has {n}+ bytes, its header says {size} (internal size error)")
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


def _header(entries, metadata: dict | None) -> bytes:
    """The JSON header of ``entries`` ((name, dtype code, shape), data in that order), unpadded."""
    header, off = {}, 0
    if metadata:
        header["__metadata__"] = dict(metadata)
    for name, code, shape in entries:
        n = math.prod(shape) * itemsize(code)
        header[name] = {"dtype": code, "shape": list(shape), "data_offsets": [off, off + n]}
        off += n
    return json.dumps(header, separators=(",", ":")).encode()


class SafetensorsStream:
    """One safetensors file whose shapes are bounded up front and known exactly only as the tensors come.

    The header's room is reserved from the bounds (no number in the exact header has more digits than
    its bound); ``put`` takes groups of tensors in any order from any thread and writes them in the
    declared order (holding only those that arrive early, at most a few per worker thread); ``close``
    writes the exact header, padded with spaces to the reserved length (the format allows trailing
    whitespace), so the bytes depend on the tensors only, never on thread timing.

    Args:
        path (Path): the file to create. groups (list[tuple[str, list[tuple[str, str, tuple]]]]): per group
            (a module) its (name, dtype code, largest shape) entries, in file order.
        metadata (dict[str, str] | None): ``__metadata__``.
    """

    def __init__(self, path, groups, metadata: dict | None = None):
        self.path, self._metadata = Path(path), metadata
        self._groups = [g for g, _ in groups]
        self._bounds = {g: list(entries) for g, entries in groups}
        bound = _header([e for _, entries in groups for e in entries], metadata)
        self._room = len(bound) + (-len(bound) % 8)
        self._f = open(self.path, "xb")
        self._f.write(b"\0" * (8 + self._room))
        self._next = 0
        self._early: dict = {}
        self._entries: list = []
        self._lock = threading.Lock()

    def put(self, group: str, tensors: dict) -> None:
        """Hand over one group's tensors (``{name: tensor}``, the names of its bounds); written in file order."""
        bounds = self._bounds.get(group)
        if bounds is None or sorted(tensors) != sorted(n for n, _, _ in bounds):
            raise ModelError(f"{self.path}: unexpected tensors {sorted(tensors)} for {group} (internal)")
        for name, code, shape in bounds:
            t = tensors[name]
            if DTYPE_CODES.get(t.dtype) != code or len(t.shape) != len(shape) or any(
                    a > b for a, b in zip(t.shape, shape)):
                raise ModelError(f"{self.path}: {name} is {t.dtype} {tuple(t.shape)}, over its bound {code} "
                                 f"{tuple(shape)} (internal)")
        with self._lock:
            self._early[group] = tensors
            while self._next < len(self._groups) and self._groups[self._next] in self._early:
                g = self._groups[self._next]
                for name, code, _ in self._bounds[g]:
                    t = self._early[g][name]
                    self._f.write(tensor_bytes(t))
                    self._entries.append((name, code, tuple(t.shape)))
                del self._early[g]
                self._next += 1

    def close(self) -> str:
        """Write the exact header into its room and close; returns the file's sha256 (read back once)."""
        if self._next != len(self._groups):
            raise ModelError(f"{self.path}: {len(self._groups) - self._next} modules were not written (internal)")
        raw = _header(self._entries, self._metadata)
        raw += b" " * (self._room - len(raw))
        self._f.seek(0)
        self._f.write(len(raw).to_bytes(8, "little") + raw)
        self._f.close()
        h = hashlib.sha256()
        with open(self.path, "rb") as f:
            while chunk := f.read(1 << 24):
                h.update(chunk)
        return h.hexdigest()

    def abort(self) -> None:
        """Close the file after an error (the caller's transaction removes it)."""
        self._f.close()


def write_index(path, weight_map: dict, total_size: int) -> None:
    """``model.safetensors.index.json``: ``{"metadata": {"total_size"}, "weight_map": {tensor: shard}}``."""
    data = {"metadata": {"total_size": int(total_size)}, "weight_map": dict(sorted(weight_map.items()))}
    Path(path).write_text(json.dumps(data, indent=2) + "\n")
