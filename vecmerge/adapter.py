"""Reading PEFT LoRA folders module by module: the tensors, their layout, validation, hashes.

A module's update is ``scale * B @ A`` in the LoRA layout (B = ``lora_B`` (out, r), A = ``lora_A``
(r, in)). Where the base weight is stored the other way round (``fan_in_fan_out``, and embedding
LoRA whose ``lora_embedding_B @ lora_embedding_A`` is (dim, vocab)), ``ModuleSpec.transposed`` says
so; the algebra does not care, ``weight_delta`` applies it. This is the only module that reads
tensor files; the names and rules of the format live in ``peft_format``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import torch

from .errors import AdapterError
from .lowrank import LowRank
from .peft_format import (
    BIN_NAME,
    CONFIG_NAME,
    KEY,
    PREFIX,
    SAFETENSORS_DTYPES,
    SAFETENSORS_NAME,
    STORED_DTYPES,
    LoraConfig,
    peft_scale,
)


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


@dataclass(frozen=True)
class ModuleSpec:
    """What a module is, without its tensors.

    Args:
        name (str): module path in the model, e.g. ``model.layers.0.self_attn.q_proj``.
        kind (str): ``linear`` or ``embedding`` (which key names it is stored under).
        shape (tuple[int, int]): (out, in) of ``B @ A``. rank (int): stored r. scale (float).
        transposed (bool): the base weight holds ``(B @ A).T``.
        dtype (str): fp32, fp16 or bf16. keys (tuple[str, str]): the file keys of A and B.
    """

    name: str
    kind: str
    shape: tuple
    rank: int
    scale: float
    transposed: bool
    dtype: str
    keys: tuple

    @property
    def weight_shape(self) -> tuple[int, int]:
        return (self.shape[1], self.shape[0]) if self.transposed else self.shape


class Adapter:
    """A PEFT LoRA folder opened for reading. Tensors are read per module, on demand.

    Args:
        path (str | Path): the folder holding ``adapter_config.json`` and the weights.
        modules_to_save (str): ``refuse`` (default) an adapter that also saves full modules, or
            ``drop`` them (the result then carries none of them: they are not a LoRA update).
    """

    def __init__(self, path, modules_to_save: str = "refuse"):
        self.path = Path(path)
        if not self.path.is_dir():
            raise AdapterError(f"{self.path}: no such adapter folder; check the path or the name in vecmerge.yaml")
        self.config = LoraConfig.read(self.path / CONFIG_NAME)
        self.modules_to_save_policy = modules_to_save
        self.weights_path = self._find_weights()
        self._tensors = self._open()
        saved = [k for k in self._tensors[0] if "modules_to_save" in k]
        if (self.config.modules_to_save or saved) and modules_to_save != "drop":
            what = self.config.modules_to_save or sorted({k.split(".modules_to_save")[0] for k in saved})
            raise AdapterError(
                f"{self.path}: modules_to_save {what} are full trained weights, not a LoRA update, and have no "
                "meaningful sum; pass --modules-to-save drop to merge the LoRA part only (the output saves none)"
            )
        self.base_layer_copies: list[str] = []
        self.saved_keys: list[str] = []  # full weights of modules_to_save, as PEFT saves them (<module>.<param>)
        self.specs = self._index()

    # -- opening ----------------------------------------------------------------------------
    def _find_weights(self) -> Path:
        for name in (SAFETENSORS_NAME, BIN_NAME):
            if (self.path / name).is_file():
                return self.path / name
        raise AdapterError(f"{self.path}: no {SAFETENSORS_NAME} or {BIN_NAME}; copy the weights next to the config")

    def _open(self):
        p = self.weights_path
        try:
            if p.suffix == ".safetensors":
                from safetensors import safe_open

                handle = safe_open(str(p), framework="pt")
                return {k: handle.get_slice(k) for k in handle.keys()}, handle
            sd = torch.load(str(p), map_location="cpu", weights_only=True)
            if not isinstance(sd, dict):
                raise ValueError("not a state dict")
            return sd, None
        except Exception as e:  # safetensors raises its own types for truncated/corrupt headers
            msg = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise AdapterError(f"{p}: cannot read tensors ({msg}); the file is truncated or corrupt, "
                               "copy it again") from None

    def _shape(self, key) -> tuple:
        t = self._tensors[0][key]
        return tuple(t.get_shape()) if self._tensors[1] is not None else tuple(t.shape)

    def _dtype(self, key) -> str:
        t = self._tensors[0][key]
        if self._tensors[1] is None:
            return STORED_DTYPES.get(t.dtype, str(t.dtype))
        return SAFETENSORS_DTYPES.get(t.get_dtype(), t.get_dtype())

    def _index(self) -> dict[str, ModuleSpec]:
        parts: dict[str, dict[str, str]] = {}
        for key in self._tensors[0]:
            m = KEY.match(key)
            if m is None:
                if "modules_to_save" in key:
                    continue  # reported through the config's modules_to_save
                if self._saved_module(key):
                    self.saved_keys.append(key)  # PEFT >= 0.15 saves them as base_model.model.<module>.<param>
                    continue
                if key.endswith(".base_layer.weight"):
                    # PEFT saves a copy of a targeted embedding's base weight (save_embedding_layers);
                    # it is the base model's weight, not part of the update.
                    self.base_layer_copies.append(key)
                    continue
                hint = "DoRA magnitude" if "lora_magnitude_vector" in key else "a tensor that is not a LoRA factor"
                raise AdapterError(f"{self.weights_path}: key {key!r} is {hint}; vecmerge handles plain LoRA only")
            slot = "A" if m["kind"].endswith("A") else "B"
            kind = "embedding" if "embedding" in m["kind"] else "linear"
            entry = parts.setdefault(m["mod"], {"kind": kind})
            if slot in entry:
                raise AdapterError(f"{self.weights_path}: module {m['mod']} has two lora_{slot} tensors "
                                   "(several adapter names?); save one adapter per folder")
            entry[slot] = key
        specs = {}
        for mod, entry in sorted(parts.items()):
            specs[mod] = self._spec(mod, entry)
        if not specs:
            raise AdapterError(f"{self.weights_path}: no LoRA tensors found; is this a LoRA adapter?")
        return specs

    def _saved_module(self, key: str) -> bool:
        """A tensor of a ``modules_to_save`` module: its module path ends with an entry (PEFT's rule)."""
        module = key.removeprefix(PREFIX).rsplit(".", 1)[0]
        return any(module.endswith(entry) for entry in self.config.modules_to_save)

    def _spec(self, mod: str, entry: dict) -> ModuleSpec:
        where = f"{self.weights_path}: module {mod}"
        for slot in "AB":
            if slot not in entry:
                raise AdapterError(f"{where}: lora_{slot} is missing; the file is incomplete, save the adapter again")
        a_shape, b_shape = self._shape(entry["A"]), self._shape(entry["B"])
        if len(a_shape) != 2 or len(b_shape) != 2:
            raise AdapterError(f"{where}: lora_A {a_shape} / lora_B {b_shape} are not matrices "
                               "(convolution LoRA is not supported)")
        if a_shape[0] != b_shape[1]:
            raise AdapterError(f"{where}: lora_A {a_shape} and lora_B {b_shape} disagree on the rank; "
                               "the factors come from different runs, save the adapter again")
        r, alpha = self.config.resolve(mod)
        if a_shape[0] != r:
            raise AdapterError(f"{where}: tensors have rank {a_shape[0]} but the config resolves r={r}; "
                               "fix r/rank_pattern in adapter_config.json")
        dtypes = {self._dtype(entry["A"]), self._dtype(entry["B"])}
        bad = dtypes - set(STORED_DTYPES.values())
        if bad:
            raise AdapterError(f"{where}: stored as {sorted(bad)[0]}; vecmerge reads fp32, fp16 and bf16 "
                               "(dequantize first)")
        kind = entry["kind"]
        transposed = kind == "embedding" or self.config.fan_in_fan_out
        return ModuleSpec(name=mod, kind=kind, shape=(b_shape[0], a_shape[1]), rank=a_shape[0],
                          scale=peft_scale(alpha, r, self.config.use_rslora), transposed=transposed,
                          dtype="/".join(sorted(dtypes)), keys=(entry["A"], entry["B"]))

    # -- reading ----------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.path.name

    @property
    def modules(self) -> list[str]:
        return list(self.specs)

    def _read(self, key) -> torch.Tensor:
        t = self._tensors[0][key]
        return t[:] if self._tensors[1] is not None else t

    def factors(self, module: str, device=None) -> LowRank:
        """Read one module as ``LowRank(lora_B, lora_A, scale)`` in its stored dtype, on ``device``.

        Raises AdapterError naming the module and tensor if any entry is NaN or Inf.
        """
        spec = self.specs[module]
        try:
            A, B = self._read(spec.keys[0]), self._read(spec.keys[1])
        except Exception as e:
            raise AdapterError(f"{self.weights_path}: module {module}: cannot read tensors ({e}); "
                               "the file is truncated or corrupt, copy it again") from None
        for slot, t in (("lora_A", A), ("lora_B", B)):
            if not torch.isfinite(t).all():
                bad = int((~torch.isfinite(t)).sum())
                raise AdapterError(f"{self.weights_path}: module {module}: {slot} has {bad} NaN/Inf entries; "
                                   "the checkpoint diverged, use an earlier one")
        if device is not None:
            A, B = A.to(device), B.to(device)
        return LowRank(B, A, spec.scale)

    def weight_delta(self, module: str) -> torch.Tensor:
        """The dense update in the base weight's layout (as PEFT's ``get_delta_weight``). Tests only."""
        d = self.factors(module).dense()
        return d.T if self.specs[module].transposed else d

    @cached_property
    def sha256(self) -> str:
        """sha256 of the weights file."""
        return sha256_file(self.weights_path)

    @cached_property
    def config_sha256(self) -> str:
        return sha256_file(self.path / CONFIG_NAME)

    def __repr__(self) -> str:
        return f"Adapter({str(self.path)!r}, modules={len(self.specs)})"
