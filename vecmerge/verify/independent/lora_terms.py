"""verify's own reading of a plain LoRA folder: ``{module: (s * B, A)}`` as float64 numpy, nothing shared.

The pipeline reads adapters through ``peft.adapter`` (its key rules, scale rules and dtype handling); a bug
there would be a bug in every output *and* in any check that read them the same way. This module reads a
folder again by PEFT's rules written out once more, on its own, for ``verify.independent.derive``:

- keys ``base_model.model.<module>.lora_A.weight`` / ``lora_B.weight`` (``lora_embedding_A`` / ``_B`` for
  embeddings); every other key (``modules_to_save``, a trained head) is not part of ``B @ A`` and is skipped;
- rank and alpha per module: the first key of ``rank_pattern`` / ``alpha_pattern`` whose regex
  ``(.*\\.)?(KEY)$`` matches the module (PEFT's rule), else ``r`` / ``lora_alpha``;
- scale ``alpha / r``, or ``alpha / sqrt(r)`` with ``use_rslora``; the pattern's r must be the stored rank;
- tensors decoded from their bytes by numpy (F32, F16, BF16 through its upper 16 bits), never by torch.

Only the bytes come through ``io``: the bounded JSON parser, the checked safetensors reader (its sha256 is
compared with the manifest's pin) and the time-bounded regex matcher. Folders this reading does not cover
(``target_parameters`` experts, ``.bin`` weights) are named by ``uncovered``; a ``lora_bias`` folder's
``<module>.lora_B.bias`` is read as the bias update ``scale * lora_B.bias`` (``LoraFolder.bias``); a DoRA
folder's ``lora_magnitude_vector`` m gives the effective update ``diag(m / n) (W + s B A) - W`` with n the row
norms of ``W + s B A`` and W the base model's weight (Liu et al. 2024, PEFT's ``dora.py``; ``dora_update``).
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ...io.parse import load_json
from ...io.patterns import PatternSet
from ...io.safetensors_read import TensorFile
from ..digests import digest

PREFIX = "base_model.model."
FACTORS = {".lora_A.weight": ("A", ".lora_B.weight"), ".lora_embedding_A": ("A", ".lora_embedding_B")}


@dataclass
class LoraFolder:
    """One adapter folder as verify reads it.

    Args:
        path (Path): the folder. config (dict): ``adapter_config.json``. file (TensorFile): its weights.
        sha256 (str): the weights' sha256 as read. keys (dict[str, tuple[str, str]]): module -> (A key, B key).
        bias_keys (dict[str, str]): module -> its ``lora_B.bias`` key (``lora_bias`` adapters).
        magnitude_keys (dict[str, str]): module -> its ``lora_magnitude_vector`` key (DoRA adapters).
    """

    path: Path
    config: dict
    file: TensorFile
    sha256: str
    keys: dict
    bias_keys: dict = field(default_factory=dict)
    magnitude_keys: dict = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)  # one file position: reads take turns

    @property
    def modules(self) -> list[str]:
        return list(self.keys)

    def close(self) -> None:
        self.file.close()

    def rank_alpha(self, module: str) -> tuple[int, float]:
        """``(r, alpha)`` of ``module`` by the config's patterns (PEFT's first-match rule)."""
        c = self.config
        r, alpha = c.get("r", 8), c.get("lora_alpha", 8)
        for name, default in (("rank_pattern", r), ("alpha_pattern", alpha)):
            pats = c.get(name) or {}
            key = PatternSet(pats, field=name, source=self.path / "adapter_config.json").first_key(module) \
                if pats else None
            value = pats[key] if key is not None else default
            r, alpha = (value, alpha) if name == "rank_pattern" else (r, value)
        return r, alpha

    def scale(self, module: str) -> float:
        """PEFT's scale of ``module``: ``alpha / r`` (``alpha / sqrt(r)`` with use_rslora)."""
        r, alpha = self.rank_alpha(module)
        return alpha / math.sqrt(r) if self.config.get("use_rslora") else alpha / r

    def factors(self, module: str) -> tuple[np.ndarray, np.ndarray]:
        """``(s * B, A)`` of ``module`` in float64: B (out, r) with the scale folded in, A (r, in)."""
        ka, kb = self.keys[module]
        with self.lock:
            A, B = _array(self.file, ka), _array(self.file, kb)
        r, _ = self.rank_alpha(module)
        if A.ndim != 2 or B.ndim != 2 or A.shape[0] != B.shape[1] or A.shape[0] != r:
            raise ValueError(f"{self.path}: module {module}: lora_A {A.shape} and lora_B {B.shape} do not make a "
                             f"rank-{r} update as its config says")
        return B * self.scale(module), A


    def bias(self, module: str) -> np.ndarray | None:
        """``scale * lora_B.bias`` of ``module`` (out,) in float64, or None without one."""
        key = self.bias_keys.get(module)
        if key is None:
            return None
        with self.lock:
            v = _array(self.file, key)
        if v.shape != (self.factors(module)[0].shape[0],):
            raise ValueError(f"{self.path}: {key} has shape {v.shape}, not lora_B's output size")
        return v * self.scale(module)


    def magnitude(self, module: str) -> np.ndarray:
        """A DoRA module's magnitudes m (out,), float64."""
        with self.lock:
            return _array(self.file, self.magnitude_keys[module])


def dora_update(W: np.ndarray, B: np.ndarray, A: np.ndarray, m: np.ndarray) -> np.ndarray:
    """DoRA's effective update ``diag(m / n) (W + B A) - W``, n the row norms of ``W + B A`` (B with its scale).

    Args:
        W (np.ndarray): (out, in) the base weight. B, A (np.ndarray): the scaled factors. m (np.ndarray): (out,).
    """
    V = W + B @ A
    n = np.linalg.norm(V, axis=1)
    if not np.all(np.isfinite(n)) or not np.all(n > 0):
        raise ValueError("DoRA: a row of W + sBA is zero or not finite, so its direction is undefined")
    return (m / n)[:, None] * V - W


def base_weight(folder, name: str) -> np.ndarray:
    """Tensor ``name`` of a base model folder (``io.model_folder.ModelFolder``) decoded by numpy as float64."""
    info = folder.info(name)
    return _decode(np.asarray(folder.read_bytes(name)), info.dtype, info.shape)


def _array(f: TensorFile, name: str) -> np.ndarray:
    """Tensor ``name`` of ``f`` decoded by numpy as float64 (bf16: its 16 bits are the top of a float32)."""
    info = f.tensors[name]
    return _decode(np.asarray(f.read_bytes(info, feed_hash=False)), info.dtype, info.shape)


def _decode(raw: np.ndarray, dtype: str, shape) -> np.ndarray:
    """Raw little-endian bytes of a safetensors tensor as float64 (bf16: the top 16 bits of a float32)."""
    if dtype == "BF16":
        x = (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    else:
        x = raw.view({"F64": np.float64, "F32": np.float32, "F16": np.float16}[dtype])
    return x.reshape(shape).astype(np.float64)


def uncovered(folder: Path) -> str | None:
    """Why verify's own reading does not cover ``folder`` (DoRA, experts, lora_bias, .bin), or None."""
    folder = Path(folder)
    if not (folder / "adapter_model.safetensors").is_file():
        return f"{folder.name}: weights not in adapter_model.safetensors"
    c = load_json(folder / "adapter_config.json")
    if not isinstance(c, dict):
        return f"{folder.name}: adapter_config.json is not an object"
    for key, what in (("target_parameters", "MoE expert parameters"),):
        if c.get(key):
            return f"{folder.name}: {what}"
    if c.get("peft_type", "LORA") != "LORA":
        return f"{folder.name}: peft_type {c.get('peft_type')!r}"
    return None


def read_folder(folder: Path) -> LoraFolder:
    """``folder``'s config and weights: header checked, file hashed, tensors read one module at a time (memory of a
    module, not of the file); ``close()`` the returned folder's file when done."""
    folder = Path(folder)
    config = load_json(folder / "adapter_config.json")
    f = TensorFile(folder / "adapter_model.safetensors")  # held open (one file throughout), read a tensor at a time
    sha = digest(f.path, f.sha256)  # hashed once per verify call (the inputs check has hashed the same file)
    keys, bias_keys, magnitude_keys = {}, {}, {}
    for name in f.tensors:
        if isinstance(config, dict) and config.get("use_dora") and ".lora_magnitude_vector" in name:
            module = name.split(".lora_magnitude_vector")[0]
            magnitude_keys[module[len(PREFIX):] if module.startswith(PREFIX) else module] = name
        if name.endswith(".lora_B.bias"):
            module = name[:-len(".lora_B.bias")]
            bias_keys[module[len(PREFIX):] if module.startswith(PREFIX) else module] = name
        for a_suffix, (_, b_suffix) in FACTORS.items():
            if name.endswith(a_suffix):
                module = name[:-len(a_suffix)]
                module = module[len(PREFIX):] if module.startswith(PREFIX) else module
                b = name[:-len(a_suffix)] + b_suffix
                if b not in f.tensors:
                    raise ValueError(f"{folder}: {name} has no {b}")
                keys[module] = (name, b)
    return LoraFolder(folder, config, f, sha, keys, bias_keys, magnitude_keys)
