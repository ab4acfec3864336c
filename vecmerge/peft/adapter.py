"""Reading PEFT LoRA folders module by module: the tensors, their layout, validation, hashes.

A module's update is ``scale * B @ A`` in the LoRA layout (B = ``lora_B`` (out, r), A = ``lora_A``
(r, in)). Where the base weight is stored the other way round (``fan_in_fan_out``, and embedding
LoRA whose ``lora_embedding_B @ lora_embedding_A`` is (dim, vocab)), ``ModuleSpec.transposed`` says
so; the algebra does not care, ``weight_delta`` applies it. Tensors are read through the one checked
safetensors reader (``io.safetensors_read.TensorFile``: the header checked on opening, ``load`` reading the
file once into memory, hashed in the same pass); the names and rules of the format live in ``peft.format``,
the content hash the ledger keys on in ``peft.content_hash``.

Parameters adapted through ``target_parameters`` (PEFT's ``ParamWrapper``) are read as modules too: a
2-D one (a router's ``weight``) as one module named after its module, a 3-D one (fused MoE experts)
as one module per expert, ``<module>.<parameter>.<e>``, each ``scale * B_e @ A_e`` of shape (out, in)
with the parameter's r and scale (``ModuleSpec.param``, ``expert``, ``experts``, ``holder``). Every
expression, audit, method and rank cut then sees plain modules; ``peft.write.pack_params`` groups the
experts back.
"""

from __future__ import annotations

from functools import cached_property
from pathlib import Path

import torch

from ..errors import AdapterError, ModelError, few
from ..io.hashing import sha256_file
from ..io.parse import short
from ..io.safetensors_read import TensorFile
from ..linalg.lowrank import LowRank
from .content_hash import content_sha256, weights_file
from .format import (
    BIN_NAME,
    CONFIG_NAME,
    KEY,
    PREFIX,
    SAFETENSORS_DTYPES,
    SAFETENSORS_NAME,
    STORED_DTYPES,
    LoraConfig,
    entry_name,
    expert_factors,
    nesting_order,
    param_candidates,
    peft_scale,
    targeted,
    unwrap,
)
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
        self.magnitude_keys: dict[str, str] = {}  # DoRA: module -> its lora_magnitude_vector's key
        self.bias_keys: dict[str, str] = {}  # lora_bias: module -> its lora_B.bias key
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
        self.base_layer_copies: list[str] = []
        self.saved_modules: list[str] = []  # keys of full saved modules left out (modules_to_save: drop)
        self.specs = self._index()

    @property
    def saved_keys(self) -> list[str]:
        """The file keys of the saved full modules (``modules_to_save``), as in ``saved_modules``."""
        return list(self.saved_modules)

    def _is_saved_module(self, key: str) -> bool:
        """A full weight of a ``modules_to_save`` module: ``...modules_to_save...`` (older PEFT) or, as
        peft 0.21 saves it, ``base_model.model.<module>.<param>`` for a module the config lists."""
        if "modules_to_save" in key:
            return True
        mod = key.removeprefix(PREFIX).rsplit(".", 1)[0]
        return any(mod == n or mod.endswith(f".{n}") for n in self.config.modules_to_save)

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

    def _index(self) -> dict[str, ModuleSpec]:
        parts: dict[str, dict[str, str]] = {}
        for key in self.tensor_keys:
            if key.endswith(".lora_B.bias") and self.config.raw.get("lora_bias"):
                self.bias_keys[key.removeprefix(PREFIX).removesuffix(".lora_B.bias")] = key
                continue
            m = KEY.match(key)
            if m is None and self.config.use_dora and ".lora_magnitude_vector" in key:
                mod = key.removeprefix(PREFIX).split(".lora_magnitude_vector")[0]
                self.magnitude_keys[mod] = key
                continue
            if m is None:
                if self._is_saved_module(key):
                    self.saved_modules.append(key)  # refused in __init__ unless the policy is drop
                    continue
                if key.endswith(".base_layer.weight"):
                    # PEFT saves a copy of a targeted embedding's base weight (save_embedding_layers);
                    # it is the base model's weight, not part of the update.
                    self.base_layer_copies.append(key)
                    continue
                hint = "DoRA magnitude" if "lora_magnitude_vector" in key else "a tensor that is not a LoRA factor"
                bias = self.config.raw.get("bias", "none")
                if key.endswith(".bias") and isinstance(bias, str) and bias != "none":
                    raise AdapterError(f"{self.weights_path}: key {key!r} is a bias the adapter trained (bias={bias!r} "
                                       f"in {CONFIG_NAME}), which is not part of B@A; vecmerge handles plain LoRA only "
                                       "(train with bias='none')")
                raise AdapterError(f"{self.weights_path}: key {key!r} is {hint}; vecmerge handles plain LoRA only")
            slot = "A" if m["kind"].endswith("A") else "B"
            kind = "embedding" if "embedding" in m["kind"] else "linear"
            entry = parts.setdefault(m["mod"], {"kind": kind})
            if slot in entry:
                raise AdapterError(f"{self.weights_path}: module {m['mod']} has two lora_{slot} tensors "
                                   "(several adapter names?); save one adapter per folder")
            entry[slot] = key
        holders: dict[str, dict] = {}
        for mod, entry in parts.items():
            holder, depth = unwrap(mod)
            holders.setdefault(holder, {})[depth] = (mod, entry)
        specs: dict = {}
        for holder, levels in sorted(holders.items()):
            if max(levels) > 0 or (param_candidates(self.config.raw, holder)
                                   and not targeted(self.config.raw, holder)):
                specs.update((s.name, s) for s in self._param_specs(holder, levels))
            else:
                specs[holder] = self._spec(holder, levels[0][1])
        if not specs:
            raise AdapterError(f"{self.weights_path}: no LoRA tensors found; is this a LoRA adapter?")
        odd = [m for m in self.bias_keys if m not in specs or specs[m].kind != "linear" or specs[m].param]
        lack = [m for m in specs if m not in self.bias_keys] if self.config.raw.get("lora_bias") else []
        if odd or lack:
            what = (f"lora_B.bias of {few(odd)} is not on a LoRA linear layer" if odd
                    else f"lora_bias is set but {few(lack)} store no lora_B.bias")
            raise AdapterError(f"{self.weights_path}: {what}; the file is incomplete or not PEFT's, save it again")
        if self.config.use_dora:
            odd = [m for m, s in specs.items() if s.kind != "linear" or m not in self.magnitude_keys]
            if odd:
                raise AdapterError(f"{self.weights_path}: DoRA module(s) {', '.join(odd[:3])} are not linear layers "
                                   "with a lora_magnitude_vector; vecmerge reads DoRA on linear layers only")
        return specs

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

    def _factor_shapes(self, where: str, entry: dict) -> tuple[tuple, tuple, str]:
        """lora_A and lora_B shapes and the stored dtype(s), validated: matrices agreeing on the rank."""
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
        dtypes = {self._dtype(entry["A"]), self._dtype(entry["B"])}
        bad = dtypes - set(STORED_DTYPES.values())
        if bad:
            raise AdapterError(f"{where}: stored as {sorted(bad)[0]}; vecmerge reads fp32, fp16 and bf16 "
                               "(dequantize first)")
        return a_shape, b_shape, "/".join(sorted(dtypes))

    def _spec(self, mod: str, entry: dict) -> ModuleSpec:
        where = f"{self.weights_path}: module {mod}"
        a_shape, b_shape, dtype = self._factor_shapes(where, entry)
        r, alpha = self.config.resolve(mod)
        if a_shape[0] != r:
            raise AdapterError(f"{where}: tensors have rank {a_shape[0]} but the config resolves r={r}; "
                               "fix r/rank_pattern in adapter_config.json")
        kind = entry["kind"]
        transposed = kind == "embedding" or self.config.fan_in_fan_out
        return ModuleSpec(name=mod, kind=kind, shape=(b_shape[0], a_shape[1]), rank=a_shape[0],
                          scale=peft_scale(alpha, r, self.config.use_rslora), transposed=transposed,
                          dtype=dtype, keys=(entry["A"], entry["B"]))

    def _param_names(self, holder: str, levels: dict) -> dict[int, str]:
        """``{depth: parameter}`` of the nested ParamWrappers of ``holder`` (PEFT's nesting rule)."""
        where = f"{self.weights_path}: module {holder}"
        k = len(levels)
        if sorted(levels) != list(range(k)):
            raise AdapterError(f"{where}: LoRA keys at wrapper depths {sorted(levels)} (missing levels); "
                               "the file is incomplete, save the adapter again")
        cands = param_candidates(self.config.raw, holder)
        if len(cands) > k and k == 1:  # a bare entry (down_proj) also matches under a router: keep what fits
            rows = self._shape(levels[0][1]["A"])[0] if "A" in levels[0][1] else 0
            fit = {p: v for p, v in cands.items() if rows % self.config.resolve(f"{holder}.{p}")[0] == 0}
            cands = fit or cands
        if len(cands) > k:
            top = max(cands.values())
            cands = {p: v for p, v in cands.items() if v == top}
        order = nesting_order(list(cands)) if len(cands) == k else None
        if order is None:
            raise AdapterError(
                f"{where}: {k} LoRA wrapper(s) of target_parameters, but target_parameters "
                f"{self.config.raw.get('target_parameters')!r} does not say which parameter each holds; "
                "name them with their module (e.g. 'mlp.experts.gate_up_proj') in adapter_config.json")
        return {k - 1 - i: p for i, p in enumerate(order)}

    def _param_specs(self, holder: str, levels: dict) -> list[ModuleSpec]:
        """The modules of ``holder``'s wrapped parameters: one per 2-D parameter, one per expert of a 3-D one."""
        names = self._param_names(holder, levels)
        specs, dims = [], {}
        for depth in sorted(names, reverse=True):  # innermost (registered first) first
            param, entry = names[depth], levels[depth][1]
            target = f"{holder}.{param}"
            where = f"{self.weights_path}: parameter {target}"
            a_shape, b_shape, dtype = self._factor_shapes(where, entry)
            r, alpha = self.config.resolve(target)
            if a_shape[0] % r:
                raise AdapterError(f"{where}: lora_A has {a_shape[0]} rows, not a multiple of the r={r} the config "
                                   "resolves (r per expert); fix r/rank_pattern in adapter_config.json")
            experts = a_shape[0] // r
            dims[param] = (b_shape[0], a_shape[1])
            common = dict(kind="expert" if experts > 1 else "linear", shape=dims[param], rank=r,
                          scale=peft_scale(alpha, r, self.config.use_rslora), transposed=False, dtype=dtype,
                          keys=(entry["A"], entry["B"]), param=param, experts=experts, holder=holder)
            if experts == 1:
                specs.append(ModuleSpec(name=entry_name(holder, param), **common))
            else:
                specs += [ModuleSpec(name=entry_name(holder, param, e), expert=e, **common) for e in range(experts)]
        if "gate_up_proj" in dims and "down_proj" in dims and dims["gate_up_proj"][1] != dims["down_proj"][0]:
            raise AdapterError(f"{self.weights_path}: module {holder}: gate_up_proj's input size "
                               f"{dims['gate_up_proj'][1]} differs from down_proj's output size "
                               f"{dims['down_proj'][0]}, so the wrappers are not nested as PEFT nests them "
                               "(gate_up_proj inside); the adapter was not saved by PEFT")
        return specs

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
