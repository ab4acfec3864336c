"""The modules of a PEFT LoRA weights file: its tensor keys grouped and checked into ``ModuleSpec`` s.

Each key is a factor (``lora_A`` / ``lora_B``, ``lora_embedding_A`` / ``_B``), a DoRA magnitude, a
``lora_bias``, a saved full module or a copy of a base layer; anything else is refused. A module's factors
must be matrices agreeing on the rank the config resolves (``format.LoraConfig.resolve``), its scale
``format.peft_scale``. Wrapped parameters (``target_parameters``, ``params``) become one spec per 2-D
parameter and one per expert of a 3-D one. Reading the tensors is ``adapter.Adapter``'s.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ..errors import AdapterError, few
from .format import CONFIG_NAME, KEY, PREFIX, STORED_DTYPES, LoraConfig, peft_scale, targeted
from .params import entry_name, nesting_order, param_candidates, unwrap
from .spec import ModuleSpec


class ModuleIndex:
    """The modules of one weights file, with the keys that are not LoRA factors sorted out.

    Args:
        keys (list[str]): every tensor name of the weights file.
        shape (Callable[[str], tuple]): a key's tensor shape. dtype (Callable[[str], str]): its stored dtype.
        config (LoraConfig): the adapter's config. weights_path (Path): the weights file, for messages.
    """

    def __init__(self, keys: list[str], shape: Callable[[str], tuple], dtype: Callable[[str], str],
                 config: LoraConfig, weights_path: Path):
        self.tensor_keys = list(keys)
        self._shape, self._dtype = shape, dtype
        self.config, self.weights_path = config, weights_path
        self.magnitude_keys: dict[str, str] = {}  # DoRA: module -> its lora_magnitude_vector's key
        self.bias_keys: dict[str, str] = {}  # lora_bias: module -> its lora_B.bias key
        self.base_layer_copies: list[str] = []
        self.saved_modules: list[str] = []  # keys of full saved modules left out (modules_to_save: drop)
        self.specs = self._index()

    def _is_saved_module(self, key: str) -> bool:
        """A full weight of a ``modules_to_save`` module: ``...modules_to_save...`` (older PEFT) or, as
        peft 0.21 saves it, ``base_model.model.<module>.<param>`` for a module the config lists."""
        if "modules_to_save" in key:
            return True
        mod = key.removeprefix(PREFIX).rsplit(".", 1)[0]
        return any(mod == n or mod.endswith(f".{n}") for n in self.config.modules_to_save)

    def _index(self) -> dict[str, ModuleSpec]:
        """Every key sorted into a module's factors, a DoRA magnitude, a lora_bias, a saved module or a
        base-layer copy (anything else refused); the modules' specs, checked against the config."""
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
                    self.saved_modules.append(key)  # Adapter refuses them unless the policy is drop
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
