"""Reading PEFT LoRA folders module by module: the tensors, their layout, hashes.

A module's update is ``scale * B @ A`` in the LoRA layout (B = ``lora_B`` (out, r), A = ``lora_A`` (r, in));
``ModuleSpec.transposed`` says when the base weight is stored the other way round (``fan_in_fan_out``,
embeddings), and ``weight_delta`` applies it. The keys are sorted into checked specs by ``index.ModuleIndex``;
tensors are read through the one checked safetensors reader (``io.safetensors_read.TensorFile``; ``load``
reads the file once, hashed in the same pass). A 3-D ``target_parameters`` parameter (fused MoE experts) is
read as one module per expert, ``<module>.<parameter>.<e>`` (``params.py``); ``peft.write.pack_params``
groups them back. More: docs/design/peft.md.
"""

from __future__ import annotations

from functools import cached_property
from pathlib import Path

import torch

from ..errors import AdapterError, ModelError
from ..io.hashing import sha256_file
from ..io.parse import short
from ..io.safetensors_read import TensorFile
from ..linalg.lowrank import LowRank
from .content_hash import content_sha256, weights_file
from .format import BIN_NAME, CONFIG_NAME, SAFETENSORS_DTYPES, SAFETENSORS_NAME, STORED_DTYPES, LoraConfig
from .index import ModuleIndex
from .params import expert_factors
from .spec import ModuleSpec


class Adapter:
    """A PEFT LoRA folder opened for reading. Tensors are read per module, on demand.

    Args:
        path (str | Path): the folder holding ``adapter_config.json`` and the weights.
        modules_to_save (str): ``refuse`` (default) an adapter that also saves full modules, or
            ``drop`` them (the result then carries none of them: they are not a LoRA update).
    """

    def __init__(self, path, modules_to_save: str = "refuse", dora: bool = False):
        self.path = Path(path)
        if not self.path.is_dir():
            raise AdapterError(f"{self.path}: no such adapter folder; check the path or the name in vecmerge.yaml")
        self.config = LoraConfig.read(self.path / CONFIG_NAME, dora=dora)
        self.modules_to_save_policy = modules_to_save
        self.weights_path = self._find_weights()
        self._file, self._state = self._open()  # a checked safetensors file, or a .bin's tensors
        self._experts: tuple | None = None  # (keys, A, B): the last parameter read whole, for its experts
        saved = [k for k in self.tensor_keys if "modules_to_save" in k]
        if (self.config.modules_to_save or saved) and modules_to_save != "drop":
            what = self.config.modules_to_save or sorted({k.split(".modules_to_save")[0] for k in saved})
            raise AdapterError(
                f"{self.path}: modules_to_save {what} are full trained weights, not a LoRA update, and have no "
                "meaningful sum; to use the LoRA part only pass --modules-to-save drop (project, refactor, audit; "
                "modules_to_save: drop in a recipe); the output then saves none"
            )
        index = ModuleIndex(self.tensor_keys, self._shape, self._dtype, self.config, self.weights_path)
        self.magnitude_keys = index.magnitude_keys  # DoRA: module -> its lora_magnitude_vector's key
        self.bias_keys = index.bias_keys  # lora_bias: module -> its lora_B.bias key
        self.base_layer_copies = index.base_layer_copies  # saved copies of targeted embeddings' base weights
        self.saved_modules = index.saved_modules  # keys of full saved modules left out (modules_to_save: drop)
        self.specs = index.specs

    @property
    def saved_keys(self) -> list[str]:
        """The file keys of the saved full modules (``modules_to_save``), as in ``saved_modules``."""
        return list(self.saved_modules)

    # -- opening ----------------------------------------------------------------------------
    def _find_weights(self) -> Path:
        found = weights_file(self.path)
        if found is not None:
            return found
        raise AdapterError(f"{self.path}: no {SAFETENSORS_NAME} or {BIN_NAME}; copy the weights next to the config")

    def _open(self) -> tuple[TensorFile | None, dict]:
        """``(TensorFile, {})`` for safetensors (its header checked, through ``io.safetensors_read``), or
        ``(None, {key: tensor})`` for a ``.bin`` file (loaded with ``weights_only``)."""
        p = self.weights_path
        if p.suffix == ".safetensors":
            try:
                return TensorFile(p, keep_open=False), {}
            except ModelError as e:
                raise AdapterError(str(e)) from None
        try:
            sd = torch.load(str(p), map_location="cpu", weights_only=True)
        except Exception as e:  # torch raises many types for truncated or hostile pickles
            msg = str(e).splitlines()[0] if str(e) else type(e).__name__
            if "Weights only load failed" in msg:
                raise AdapterError(f"{p}: holds objects other than tensors, which vecmerge does not unpickle; "
                                   "save the adapter with safetensors (save_pretrained's default)") from None
            raise AdapterError(f"{p}: cannot read tensors ({short(msg, 120)[1:-1]}); the file is truncated or "
                               "corrupt, copy it again") from None
        bad = "is not a state dict (a mapping of names to tensors)" if not isinstance(sd, dict) else next(
            (f"has a key {short(k, 40)} of type {type(k).__name__}, not a tensor name" if not isinstance(k, str)
             else f"key {short(k, 60)} holds a {type(v).__name__}, not a tensor"
             for k, v in sd.items() if not isinstance(k, str) or not isinstance(v, torch.Tensor)), None)
        if bad:
            raise AdapterError(f"{p}: {bad}; save the adapter with PEFT's save_pretrained")
        return None, sd

    @property
    def tensor_keys(self) -> list[str]:
        """Every tensor name the weights file holds (sorted for safetensors, as stored for ``.bin``)."""
        return sorted(self._file.tensors) if self._file is not None else list(self._state)

    def _shape(self, key) -> tuple:
        return tuple(self._file.tensors[key].shape) if self._file is not None else tuple(self._state[key].shape)

    def _dtype(self, key) -> str:
        if self._file is None:
            t = self._state[key]
            return STORED_DTYPES.get(t.dtype, str(t.dtype))
        code = self._file.tensors[key].dtype
        return SAFETENSORS_DTYPES.get(code, code)

    def magnitude(self, module: str) -> torch.Tensor:
        """A DoRA module's learned magnitude vector ``m`` (out,), float64 (AdapterError if absent or not finite)."""
        key = self.magnitude_keys.get(module)
        if key is None:
            raise AdapterError(f"{self.weights_path}: module {module} has no lora_magnitude_vector")
        v = self.tensor(key).to(torch.float64)
        if v.shape != (self.specs[module].shape[0],) or not bool(torch.isfinite(v).all()):
            raise AdapterError(f"{self.weights_path}: {key}: shape {tuple(v.shape)} or non-finite values; expected "
                               f"({self.specs[module].shape[0]},) finite magnitudes, save the adapter again")
        return v

    def bias(self, module: str) -> torch.Tensor | None:
        """A ``lora_bias`` module's bias update ``scale * lora_B.bias`` (out,), float64; None without one."""
        key = self.bias_keys.get(module)
        if key is None:
            return None
        v = self.tensor(key).to(torch.float64)
        if v.shape != (self.specs[module].shape[0],) or not bool(torch.isfinite(v).all()):
            raise AdapterError(f"{self.weights_path}: {key}: shape {tuple(v.shape)} or non-finite values; expected "
                               f"({self.specs[module].shape[0]},) finite entries, save the adapter again")
        return v * self.specs[module].scale

    # -- reading ----------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.path.name

    @property
    def modules(self) -> list[str]:
        return list(self.specs)

    def load(self) -> None:
        """Read the safetensors weights file into memory once, hashing it in the same pass (``sha256``).

        The tensors then come from these bytes, so the recorded sha256 is exactly that of what was merged
        (a file replaced while vecmerge runs cannot slip in: ``TensorFile.load``), and the file is read once,
        sequentially, while each piece is still in cache. A no-op for ``.bin`` files (already in memory).
        """
        if self._file is None or self._file.loaded:
            return
        try:
            self.__dict__["sha256"] = self._file.load()
        except ModelError as e:
            raise AdapterError(str(e)) from None
        self._experts = None

    def tensor(self, key: str) -> torch.Tensor:
        """One stored tensor by its file key: from ``load``'s bytes (shared), else read from the file (its own
        memory; the file is not mapped, so memory holds only the tensors in use)."""
        if self._file is None:
            return self._state[key]
        try:
            return self._file.tensor(key)
        except ModelError as e:
            raise AdapterError(str(e)) from None

    def _expert_factors(self, spec: ModuleSpec) -> tuple[torch.Tensor, torch.Tensor]:
        """``(B_e, A_e)`` of an expert, views of its parameter's factors (read whole once for all its experts;
        modules are read on worker threads, so the cache is replaced, never changed)."""
        cached = self._experts
        if cached is None or cached[0] != spec.keys:
            cached = (spec.keys, self.tensor(spec.keys[0]), self.tensor(spec.keys[1]))
            self._experts = cached
        return expert_factors(cached[1], cached[2], spec.rank, spec.experts, spec.expert or 0)

    def factors(self, module: str, device=None) -> LowRank:
        """Read one module as ``LowRank(lora_B, lora_A, scale)`` in its stored dtype, on ``device``.

        Raises AdapterError naming the module and tensor if any entry is NaN or Inf.
        """
        spec = self.specs[module]
        try:
            if spec.kind == "expert":
                B, A = self._expert_factors(spec)
            else:
                A, B = self.tensor(spec.keys[0]), self.tensor(spec.keys[1])
        except Exception as e:
            raise AdapterError(f"{self.weights_path}: module {module}: cannot read tensors ({e}); "
                               "the file is truncated or corrupt, copy it again") from None
        for slot, t in (("lora_A", A), ("lora_B", B)):
            # one reduction: a NaN/Inf entry makes the sum non-finite (a finite sum that overflows is checked
            # entry by entry, and passes when every entry is finite)
            if not bool(torch.isfinite(t.sum(dtype=torch.float32))) and not bool(torch.isfinite(t).all()):
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
        """sha256 of the weights file (of the bytes read, after ``load``)."""
        return sha256_file(self.weights_path)

    @cached_property
    def config_sha256(self) -> str:
        """sha256 of ``adapter_config.json``."""
        return sha256_file(self.path / CONFIG_NAME)

    @property
    def content_sha256(self) -> str:
        """sha256 of the weights and the config together (``content_sha256``): the ledger's key."""
        return content_sha256(self.sha256, self.config_sha256)

    def __repr__(self) -> str:
        return f"Adapter({str(self.path)!r}, modules={len(self.specs)})"
