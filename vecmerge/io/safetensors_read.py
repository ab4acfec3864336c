"""A transformers model folder's safetensors, read one tensor at a time (``modelwrite`` writes them).

A model folder holds ``config.json`` and either ``model.safetensors`` or ``model.safetensors.index.json``
with the shards its ``weight_map`` names (plain file names in the folder). A safetensors file is an 8-byte
little-endian header length N, N bytes of JSON (``{name: {dtype, shape, data_offsets: [b, e]}}`` and an
optional ``"__metadata__"`` of strings), then the data: tensor bytes at ``8 + N + b .. 8 + N + e``.

Reading (``ModelFolder``): every header is checked before any tensor is read (bounded size, known dtypes,
``prod(shape) * itemsize == e - b``, offsets inside the file and not overlapping, the index's map equal to
the shards' contents); ``read(name)`` reads one tensor's bytes into memory (no mmap, so memory is one
tensor, not the file); each file's sha256 is taken on the fly while reads run in file order, and by a
separate pass only for files read out of order (``sha256s``).
"""

from __future__ import annotations

import hashlib
import math
import os
import queue
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..errors import ModelError, few
from .parse import ParseError, load_json, parse_json

CONFIG = "config.json"
INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"
HEADER_MAX = 100 << 20          # the safetensors library's own bound
CHUNK_BYTES = 64 << 20          # pieces in which large tensors are compared and copied
ST_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
             "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
             "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2}
DTYPE_CODES = {v: k for k, v in ST_DTYPES.items()}
FLOAT_CODES = ("F64", "F32", "F16", "BF16")
# Files of a model folder that are weights (never copied as "the base's other files").
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".gguf", ".msgpack", ".h5", ".onnx")


class BackgroundSha256:
    """sha256 of a stream whose pieces are hashed by a thread (hashlib releases the GIL on large buffers).

    ``update`` queues a buffer, which the caller must never modify afterwards (tensors read from a file
    share its memory: compute on copies); ``hexdigest`` waits for the rest.
    """

    def __init__(self, head: bytes = b""):
        self._h = hashlib.sha256(head)
        self._q: queue.Queue | None = None
        self._thread: threading.Thread | None = None

    def _drain(self) -> None:
        while (item := self._q.get()) is not None:
            self._h.update(item)

    def update(self, buf) -> None:
        if self._thread is None:
            self._q = queue.Queue(maxsize=4)
            self._thread = threading.Thread(target=self._drain, daemon=True)
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


class TensorFile:
    """One safetensors file opened for reading; its header checked, its sha256 taken as reads go in order.

    Args:
        path (Path): the file. index (int): its position among the folder's shards.
    """

    def __init__(self, path: Path, index: int = 0):
        self.path, self.index = Path(path), index
        self._f = None
        try:
            self._parse()
        except BaseException:
            self.close()
            raise

    def _parse(self) -> None:
        try:
            self._f = open(self.path, "rb")
            self.size = os.fstat(self._f.fileno()).st_size
            head = self._f.read(8)
            n = int.from_bytes(head, "little") if len(head) == 8 else -1
            if n < 2 or n > HEADER_MAX or 8 + n > self.size:
                raise ModelError(f"{self.path}: not a safetensors file (header length {n}, file {self.size} "
                                 "bytes); the file is truncated or of another format, copy it again")
            raw = self._f.read(n)
        except OSError as e:
            raise ModelError(f"{self.path}: cannot read it ({e.strerror or e}); check the path") from None
        self._sha = BackgroundSha256(head + raw)
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

    def read_bytes(self, info: TensorInfo, feed_hash: bool = True) -> np.ndarray:
        """The raw bytes of one tensor as a uint8 array (the file's sha256 is fed when such reads go in order).

        Args:
            info (TensorInfo): a tensor of this file. feed_hash (bool): False for a read outside the hashing pass.
        """
        return self._read(info, info.start, info.end, feed_hash)

    def read_chunks(self, info: TensorInfo, chunk_bytes: int = CHUNK_BYTES, feed_hash: bool = True):
        """The raw bytes of one tensor in pieces of at most ``chunk_bytes`` (whole elements), in order."""
        size = max(1, chunk_bytes // itemsize(info.dtype)) * itemsize(info.dtype)
        for s in range(info.start, info.end, size):
            yield self._read(info, s, min(s + size, info.end), feed_hash)

    def _read(self, info: TensorInfo, start: int, end: int, feed_hash: bool) -> np.ndarray:
        buf = np.empty(end - start, dtype=np.uint8)  # not zero-filled: the read fills it
        try:
            self._f.seek(start)
            got = self._f.readinto(memoryview(buf)) if end > start else 0
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

    def sha256(self) -> str:
        """The file's sha256: from the reads if they covered it in order, else by reading it again."""
        if self._digest is None:
            if not (self._ordered and self._pos == self.size):
                self._sha.stop()
                self._sha, self._pos = BackgroundSha256(), 0
                self._f.seek(0)
                for chunk in iter(lambda: self._f.read(1 << 22), b""):
                    self._sha.update(chunk)
                self._pos = self.size
            self._digest = self._sha.hexdigest()
        return self._digest

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
        if getattr(self, "_sha", None) is not None:
            self._sha.stop()


def to_tensor(buf, info: TensorInfo) -> torch.Tensor:
    """The bytes of ``info`` as a tensor of its dtype and shape (sharing ``buf``)."""
    if not info.nbytes:
        return torch.empty(info.shape, dtype=ST_DTYPES[info.dtype])
    return torch.frombuffer(buf, dtype=ST_DTYPES[info.dtype]).reshape(info.shape)


def _plain_name(name, index: Path) -> str:
    if not isinstance(name, str) or not name or "/" in name or "\\" in name or name in (".", "..") or \
            name.startswith("."):
        raise ModelError(f"{index}: weight_map names {name!r}, not a plain file name in the folder; fix the index")
    return name


class ModelFolder:
    """A transformers model folder opened for reading, one tensor at a time (see the module docstring).

    Args:
        path (str | Path): the folder. flag (str): the option that named it, for messages.
    """

    def __init__(self, path, flag: str = "--base-model"):
        self.path, self.flag = Path(path), flag
        if not self.path.is_dir():
            raise ModelError(f"{flag} {self.path}: no such folder; give a local transformers model folder")
        try:
            self.config = load_json(self.path / CONFIG) if (self.path / CONFIG).is_file() else None
        except ParseError as e:
            raise ModelError(f"{flag}: {e}") from None
        if not isinstance(self.config, dict):
            raise ModelError(f"{flag} {self.path}: no {CONFIG} (a JSON object); point at a folder saved with "
                             "save_pretrained")
        names, wmap = self._shard_names()
        self.files: list[TensorFile] = []
        self.tensors: dict[str, TensorInfo] = {}
        try:
            for i, n in enumerate(names):
                self.files.append(TensorFile(self.path / n, i))
            self._index(wmap)
        except BaseException:
            self.close()
            raise
        self.sharded = wmap is not None

    def _index(self, wmap: dict | None) -> None:
        for f in self.files:
            for k, t in f.tensors.items():
                if k in self.tensors:
                    raise ModelError(f"{f.path}: tensor {k} also lies in {self.files[self.tensors[k].file].path.name};"
                                     " the shards are from different saves, copy the model again")
                if wmap is not None and wmap.get(k) != f.path.name:
                    raise ModelError(f"{self.path / INDEX_NAME}: maps {k} to {wmap.get(k)!r}, but it lies in "
                                     f"{f.path.name}; the index and the shards disagree, copy the model again")
                self.tensors[k] = t
        if wmap is not None and set(wmap) - set(self.tensors):
            raise ModelError(f"{self.path / INDEX_NAME}: names {few(sorted(set(wmap) - set(self.tensors)))}, which "
                             "no shard holds; copy the model again")

    def _shard_names(self) -> tuple[list[str], dict | None]:
        index = self.path / INDEX_NAME
        if index.is_file():
            try:
                data = load_json(index)
            except ParseError as e:
                raise ModelError(f"{self.flag}: {e}") from None
            wmap = data.get("weight_map") if isinstance(data, dict) else None
            if not isinstance(wmap, dict) or not wmap:
                raise ModelError(f"{index}: no weight_map; the index is damaged, copy the model again")
            names = sorted({_plain_name(v, index) for v in wmap.values()})
            missing = [n for n in names if not (self.path / n).is_file()]
            if missing:
                raise ModelError(f"{index}: shard {few(missing)} is missing; copy the model again")
            return names, {str(k): v for k, v in wmap.items()}
        if (self.path / SINGLE_NAME).is_file():
            return [SINGLE_NAME], None
        others = sorted(p.name for p in self.path.glob("*.safetensors"))
        if len(others) == 1:
            return others, None
        bins = sorted(p.name for p in self.path.iterdir() if p.suffix in (".bin", ".pt", ".pth"))
        hint = (f" (it holds {few(bins)}: load it with transformers and save_pretrained it again, which writes "
                "safetensors)" if bins else "")
        raise ModelError(f"{self.flag} {self.path}: no {SINGLE_NAME} or {INDEX_NAME}{hint}; vecmerge reads "
                         "safetensors checkpoints")

    @property
    def model_type(self) -> str:
        return str(self.config.get("model_type", ""))

    def info(self, name: str) -> TensorInfo:
        return self.tensors[name]

    def read_bytes(self, name: str) -> np.ndarray:
        t = self.tensors[name]
        return self.files[t.file].read_bytes(t)

    def read_chunks(self, name: str, chunk_bytes: int = CHUNK_BYTES, feed_hash: bool = True):
        """``TensorFile.read_chunks`` of the tensor ``name``."""
        t = self.tensors[name]
        return self.files[t.file].read_chunks(t, chunk_bytes, feed_hash)

    def read(self, name: str) -> torch.Tensor:
        """One tensor, in its stored dtype (its own memory)."""
        t = self.tensors[name]
        return to_tensor(self.read_bytes(name), t)

    def in_file_order(self) -> list[str]:
        """Tensor names ordered by shard, then by position in the shard (reads in this order hash on the fly)."""
        return sorted(self.tensors, key=lambda k: (self.tensors[k].file, self.tensors[k].start))

    def weight_files(self) -> list[str]:
        return [f.path.name for f in self.files] + ([INDEX_NAME] if self.sharded else [])

    def sha256s(self) -> dict:
        """``{file name: sha256}`` of config.json, the index and every shard."""
        out = {CONFIG: sha256_file(self.path / CONFIG)}
        if self.sharded:
            out[INDEX_NAME] = sha256_file(self.path / INDEX_NAME)
        out.update({f.path.name: f.sha256() for f in self.files})
        return out

    def other_files(self) -> list[str]:
        """Top-level regular files (symbolic links followed) that are not weights, the index or hidden."""
        out = []
        for p in sorted(self.path.iterdir()):
            if p.name.startswith(".") or p.name == INDEX_NAME or p.suffix in WEIGHT_SUFFIXES or not p.is_file():
                continue
            out.append(p.name)
        return out

    def close(self) -> None:
        for f in self.files:
            f.close()

    def __enter__(self) -> ModelFolder:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file, read in 4 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()
