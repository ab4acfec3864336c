"""A transformers model folder's safetensors, read one tensor at a time (``io.safetensors_write`` writes them).

A model folder holds ``config.json`` and either ``model.safetensors`` or ``model.safetensors.index.json``
with the shards its ``weight_map`` names (plain file names in the folder). Every shard's header is checked
(``TensorFile``) before any tensor is read, and the index's map must equal the shards' contents;
``read(name)`` reads one tensor's bytes into memory; each file's sha256 is taken on the fly while reads
run in file order, and by a separate pass only for files read out of order (``sha256s``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from ..errors import ModelError, few
from .files import check_regular
from .hashing import sha256_file
from .parse import ParseError, load_json
from .safetensors_read import CHUNK_BYTES, TensorFile, TensorInfo, to_tensor

CONFIG = "config.json"
INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"
# Files of a model folder that are weights (never copied as "the base's other files").
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".gguf", ".msgpack", ".h5", ".onnx")


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
        for name in (CONFIG, INDEX_NAME, SINGLE_NAME):  # a FIFO is no file: refused, not taken as missing
            check_regular(self.path / name)
        try:
            config = load_json(self.path / CONFIG) if (self.path / CONFIG).is_file() else None
        except ParseError as e:
            raise ModelError(f"{flag}: {e}") from None
        if not isinstance(config, dict):
            raise ModelError(f"{flag} {self.path}: no {CONFIG} (a JSON object); point at a folder saved with "
                             "save_pretrained")
        self.config: dict = config
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
            for n in names:
                check_regular(self.path / n)
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
