"""The one safetensors reader: a file's header checked before any tensor is read, then tensors one at a time.

A safetensors file: an 8-byte little-endian header length N, N bytes of JSON (``{name: {dtype, shape,
data_offsets: [b, e]}}``, optional ``"__metadata__"``), then tensor bytes at ``8 + N + b .. 8 + N + e``.
``TensorFile`` checks the header (bounded, strict JSON, known dtypes, ``prod(shape) * itemsize == e - b``,
offsets inside the file and not overlapping), then reads either tensor by tensor (``read_bytes``,
``read_chunks``; hashed on the fly in file order) or, with ``load``, the whole file once into memory, hashed as
read, tensors being views of those bytes. No mmap. ``io.model_folder.ModelFolder`` reads through it.
How a replaced file is refused: docs/design/io.md.
"""

from __future__ import annotations

import math
import mmap
import os
from dataclasses import dataclass
from io import BufferedReader
from pathlib import Path

import numpy as np
import torch

from ..errors import ModelError
from .files import open_regular
from .hashing import BackgroundSha256
from .parse import ParseError, parse_json

HEADER_MAX = 100 << 20          # the safetensors library's own bound
CHUNK_BYTES = 64 << 20          # pieces in which large tensors are compared and copied
LOAD_CHUNK = 1 << 24            # bytes read (and hashed) at a time by TensorFile.load
ST_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
             "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
             "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2}
DTYPE_CODES = {v: k for k, v in ST_DTYPES.items()}
FLOAT_CODES = ("F64", "F32", "F16", "BF16")


def itemsize(code: str) -> int:
    return torch.empty(0, dtype=ST_DTYPES[code]).element_size()


@dataclass(frozen=True)
class TensorInfo:
    """Where one tensor lies. start/end are absolute file offsets; ``file`` is its shard's index."""

    name: str
    dtype: str
    shape: tuple
    file: int
    start: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.start

    @property
    def is_float(self) -> bool:
        return self.dtype in FLOAT_CODES


def _read_buffer(size: int) -> np.ndarray:
    """``size`` bytes to read a file into: an anonymous mapping with transparent huge pages where the kernel
    offers them (a first touch of fresh memory costs a page fault per 4 KiB, which is most of the cost of
    reading a file from the page cache), else plain memory; never zero-filled before the read."""
    if size > 0 and hasattr(mmap, "MADV_HUGEPAGE"):
        try:
            m = mmap.mmap(-1, size)
            m.madvise(mmap.MADV_HUGEPAGE)
            return np.frombuffer(m, dtype=np.uint8)
        except (OSError, ValueError):
            pass
    return np.empty(size, dtype=np.uint8)


class TensorFile:
    """One safetensors file opened for reading; its header checked, its sha256 taken as reads go in order.

    Args:
        path (Path): the file. index (int): its position among the folder's shards.
        keep_open (bool): hold the file open until ``close`` (else it is opened for each read).
    """

    def __init__(self, path: Path, index: int = 0, *, keep_open: bool = True):
        self.path, self.index = Path(path), index
        self._f: BufferedReader | None = None
        self._buf: np.ndarray | None = None
        self._checked = keep_open
        self._digest: str | None = None
        try:
            self._parse()
        except BaseException:
            self.close()
            raise
        if not keep_open and self._f is not None:
            self._f.close()
            self._f = None

    def _parse(self) -> None:
        try:
            self._f = f = open_regular(self.path)
            self.size = os.fstat(f.fileno()).st_size
            head = f.read(8)
            n = int.from_bytes(head, "little") if len(head) == 8 else -1
            if n < 2 or n > HEADER_MAX or 8 + n > self.size:
                raise ModelError(f"{self.path}: not a safetensors file (header length {n}, file {self.size} "
                                 "bytes); the file is truncated or corrupt (or of another format), copy it again")
            raw = f.read(n)
        except OSError as e:
            raise ModelError(f"{self.path}: cannot read it ({e.strerror or e}); check the path") from None
        self._head = head + raw
        self._sha = BackgroundSha256(self._head)
        self._pos, self._ordered, self._digest = 8 + n, True, None
        self.data_start = 8 + n
        try:
            header = parse_json(raw.decode("utf-8"), self.path)
        except (UnicodeDecodeError, ParseError) as e:
            raise ModelError(f"{self.path}: its safetensors header is not valid JSON ({e}); copy the file again"
                             ) from None
        if not isinstance(header, dict):
            raise ModelError(f"{self.path}: its safetensors header is not a JSON object; copy the file again")
        meta = header.pop("__metadata__", None) or {}
        if not isinstance(meta, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items()):
            raise ModelError(f"{self.path}: __metadata__ must map strings to strings; copy the file again")
        self.metadata = meta
        self.tensors = {k: self._entry(k, v) for k, v in header.items()}
        spans = sorted((t.start, t.end, t.name) for t in self.tensors.values() if t.nbytes)
        for (_, e0, a), (s1, _, b) in zip(spans, spans[1:]):
            if s1 < e0:
                raise ModelError(f"{self.path}: tensors {a} and {b} overlap; the file is corrupt, copy it again")

    def _entry(self, name: str, v) -> TensorInfo:
        where = f"{self.path}: tensor {name!r}"
        if not isinstance(v, dict) or set(v) != {"dtype", "shape", "data_offsets"}:
            raise ModelError(f"{where}: header entry is not {{dtype, shape, data_offsets}}; copy the file again")
        code, shape, offs = v["dtype"], v["shape"], v["data_offsets"]
        if code not in ST_DTYPES:
            raise ModelError(f"{where}: dtype {code!r} is not one vecmerge reads ({', '.join(ST_DTYPES)}); "
                             "dequantize the model first")
        ok_shape = isinstance(shape, list) and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                                                   for d in shape)
        ok_offs = (isinstance(offs, list) and len(offs) == 2 and all(isinstance(o, int) and not isinstance(o, bool)
                                                                     for o in offs) and 0 <= offs[0] <= offs[1])
        if not ok_shape or not ok_offs:
            raise ModelError(f"{where}: malformed shape {shape!r} or data_offsets {offs!r}; copy the file again")
        start, end = self.data_start + offs[0], self.data_start + offs[1]
        if end > self.size or math.prod(shape) * itemsize(code) != end - start:
            raise ModelError(f"{where}: shape {shape} of {code} does not fit data_offsets {offs} in a "
                             f"{self.size}-byte file; the file is truncated or corrupt, copy it again")
        return TensorInfo(name, code, tuple(shape), self.index, start, end)

    def _changed(self) -> ModelError:
        return ModelError(f"{self.path}: changed while being read (its header no longer matches); run again")

    def load(self) -> str:
        """Read the whole file into memory once, hashing it in the same pass; later reads come from there.

        The file is read sequentially in ``LOAD_CHUNK`` pieces, each hashed on a second thread while the next
        is read (while it is still in cache). Returns the sha256 of the bytes read; ModelError when the file
        no longer has the size and header it was opened with.
        """
        if self._buf is not None and self._digest is not None:
            return self._digest
        buf = _read_buffer(self.size)
        view, sha, pos = memoryview(buf), BackgroundSha256(), 0  # type: ignore[arg-type]
        try:
            with open_regular(self.path) as f:
                if os.fstat(f.fileno()).st_size != self.size:
                    raise self._changed()
                while pos < self.size:
                    n = f.readinto(view[pos:pos + LOAD_CHUNK])
                    if not n:
                        raise ModelError(f"{self.path}: ended after {pos} of {self.size} bytes while being read; "
                                         "copy it again")
                    sha.update(view[pos:pos + n])
                    pos += n
        except OSError as e:
            raise ModelError(f"{self.path}: cannot read it ({e.strerror or e}); copy it again") from None
        finally:
            digest = sha.hexdigest()
        if bytes(buf[:len(self._head)]) != self._head:
            raise self._changed()
        self._buf, self._digest = buf, digest
        return digest

    @property
    def loaded(self) -> bool:
        return self._buf is not None

    def read_bytes(self, info: TensorInfo, feed_hash: bool = True) -> np.ndarray:
        """The raw bytes of one tensor as a uint8 array (the file's sha256 is fed when such reads go in order).

        After ``load`` the array is a view of the loaded bytes (never modify it).

        Args:
            info (TensorInfo): a tensor of this file. feed_hash (bool): False for a read outside the hashing pass.
        """
        return self._read(info, info.start, info.end, feed_hash)

    def read_chunks(self, info: TensorInfo, chunk_bytes: int = CHUNK_BYTES, feed_hash: bool = True):
        """The raw bytes of one tensor in pieces of at most ``chunk_bytes`` (whole elements), in order."""
        size = max(1, chunk_bytes // itemsize(info.dtype)) * itemsize(info.dtype)
        for s in range(info.start, info.end, size):
            yield self._read(info, s, min(s + size, info.end), feed_hash)

    def tensor(self, name: str) -> torch.Tensor:
        """The tensor ``name`` in its stored dtype and shape (a view of the loaded bytes where they are aligned)."""
        info = self.tensors[name]
        buf = self.read_bytes(info, feed_hash=False)
        if self._buf is not None and info.start % max(itemsize(info.dtype), 1):
            buf = buf.copy()  # an unaligned tensor (allowed by the format): copied out
        return to_tensor(buf, info)

    def _read(self, info: TensorInfo, start: int, end: int, feed_hash: bool) -> np.ndarray:
        if self._buf is not None:
            return self._buf[start:end]
        buf = np.empty(end - start, dtype=np.uint8)  # not zero-filled: the read fills it
        try:
            got = self._read_into(buf, start) if end > start else 0
        except OSError as e:
            raise ModelError(f"{self.path}: cannot read tensor {info.name} ({e.strerror or e}); copy it again"
                             ) from None
        if got != end - start:
            raise ModelError(f"{self.path}: tensor {info.name} is cut short; the file changed while reading")
        if not feed_hash:
            return buf
        if self._ordered and start == self._pos:
            self._sha.update(buf)
            self._pos = end
        elif end > start:
            self._ordered = False
        return buf

    def _read_into(self, buf: np.ndarray, start: int) -> int:
        if self._f is not None:
            self._f.seek(start)
            return self._f.readinto(memoryview(buf))  # type: ignore[arg-type]
        with open_regular(self.path, buffering=0) as f:
            if not self._checked:  # the first read since opening: still the file whose header was checked?
                if os.fstat(f.fileno()).st_size != self.size or f.read(len(self._head)) != self._head:
                    raise self._changed()
                self._checked = True
            f.seek(start)
            return f.readinto(memoryview(buf))  # type: ignore[arg-type]

    def sha256(self) -> str:
        """The file's sha256: from ``load`` or the reads if they covered it in order, else by reading it again."""
        if self._digest is None:
            if not (self._ordered and self._pos == self.size):
                self._sha.stop()
                self._sha, self._pos = BackgroundSha256(), 0
                f = self._f if self._f is not None else open_regular(self.path)
                try:
                    f.seek(0)
                    for chunk in iter(lambda: f.read(1 << 22), b""):
                        self._sha.update(chunk)
                finally:
                    if f is not self._f:
                        f.close()
                self._pos = self.size
            self._digest = digest = self._sha.hexdigest()
            return digest
        return self._digest

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None
        if getattr(self, "_sha", None) is not None:
            self._sha.stop()


def to_tensor(buf, info: TensorInfo) -> torch.Tensor:
    """The bytes of ``info`` as a tensor of its dtype and shape (sharing ``buf``)."""
    if not info.nbytes:
        return torch.empty(info.shape, dtype=ST_DTYPES[info.dtype])
    return torch.frombuffer(buf, dtype=ST_DTYPES[info.dtype]).reshape(info.shape)
