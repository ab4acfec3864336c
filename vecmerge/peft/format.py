"""The PEFT LoRA format in one place: file and key names, stored dtypes, the config and its rules.

What PEFT writes and reads, and how it resolves a module's update ``scale * B @ A``:

- files ``adapter_config.json`` and ``adapter_model.safetensors`` (or ``adapter_model.bin``); keys
  ``base_model.model.<module>.lora_A.weight`` / ``lora_B.weight`` (``lora_embedding_A`` /
  ``lora_embedding_B`` for embeddings), optionally with an adapter name before ``.weight``;
- the scale ``lora_alpha / r``, or ``lora_alpha / sqrt(r)`` with rsLoRA (``peft_scale``), where r and
  alpha come from ``rank_pattern`` / ``alpha_pattern`` by PEFT's first-match rule (``pattern_key``);
- which modules a config targets (``targeted``: PEFT's ``check_target_module_exists`` rule);
LoRA on raw parameters (``target_parameters``, PEFT's ``ParamWrapper``: MoE models' fused 3-D experts) has
its own module, ``params``. Used by the reader (``adapter.py``, ``index.py``), the writer (``write.py``) and
``testing`` (not by ``verify.independent``).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TypeGuard

import torch

from ..errors import AdapterError, few
from ..io.files import check_regular
from ..io.parse import ParseError, load_json, short
from ..io.patterns import PatternSet, check_regex, first_match

CONFIG_NAME = "adapter_config.json"
SAFETENSORS_NAME = "adapter_model.safetensors"
BIN_NAME = "adapter_model.bin"
PREFIX = "base_model.model."
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
STORED_DTYPES = {v: k for k, v in DTYPES.items()}
SAFETENSORS_DTYPES = {"F32": "fp32", "F16": "fp16", "BF16": "bf16"}

# Config features whose update is not scale * B @ A on the original base weight.
UNSUPPORTED = {
    "use_dora": "DoRA rescales the weight by a learned magnitude, so its update is not B@A",
    "trainable_token_indices": "trainable tokens are full embedding rows, not a LoRA update",
    "layer_replication": "layer replication changes the model's layers",
    "alora_invocation_tokens": "activated LoRA applies its update to some tokens only",
    "use_qalora": "QA-LoRA pools the input, so its update is not B@A",
    "use_bdlora": "block-diagonal LoRA stores its factors differently",
    "arrow_config": "Arrow routing mixes several LoRAs per token",
    "monteclora_config": "MonteCLoRA samples its update",
}
BIAS_KEY = "{prefix}{module}.lora_B.bias"  # lora_bias: lora_B's bias, the layer's output gains scale * it
BASE_CHANGING_INITS = ("pissa", "olora", "corda", "lora_ga", "loftq")  # inits that move the base weight

KEY = re.compile(
    r"^(?:base_model\.model\.)?(?P<mod>.+?)\.(?P<kind>lora_A|lora_B|lora_embedding_A|lora_embedding_B)"
    r"(?:\.(?P<adapter>[A-Za-z0-9_\-]+))?(?:\.weight)?$"
)


CONFIG_MAX_BYTES = 16 << 20
_COVERAGE = ("target_modules", "exclude_modules", "layers_pattern", "layers_to_transform")
MAX_RANK = 1 << 20


def pattern_key(patterns, name: str, *, field: str = "rank_pattern", source=CONFIG_NAME) -> str | None:
    """PEFT's rule: the first key ``k`` for which ``re.match(rf"(.*\\.)?({k})$", name)`` holds.

    Keys are checked and matched under a time budget (``safe_pattern``): a key that is not a valid or
    safe regex is a PatternError (exit 2) naming ``field`` and ``source``, never a hang.
    """
    return PatternSet(patterns, field=field, source=source).first_key(name)


def peft_scale(alpha: float, r: int, rslora: bool) -> float:
    """PEFT's scale: ``alpha / sqrt(r)`` with rsLoRA, else ``alpha / r``."""
    return alpha / math.sqrt(r) if rslora else alpha / r


@dataclass(frozen=True)
class LoraConfig:
    """The parts of ``adapter_config.json`` that decide the update; ``raw`` keeps the rest.

    Args:
        r (int): default rank. lora_alpha (float): default alpha. use_rslora (bool): scale rule.
        rank_pattern, alpha_pattern (dict[str, float]): per-module overrides, PEFT regex keys.
        fan_in_fan_out (bool): base weights stored (in, out), as in GPT-2's Conv1D.
        base_model (str | None), target_modules, modules_to_save (list): as in the file.
        raw (dict): the whole file. source (str): where it was read (for messages).
    """

    r: int
    lora_alpha: float
    use_rslora: bool = False
    rank_pattern: dict = field(default_factory=dict)
    alpha_pattern: dict = field(default_factory=dict)
    fan_in_fan_out: bool = False
    base_model: str | None = None
    target_modules: object = None
    modules_to_save: list = field(default_factory=list)
    raw: dict = field(default_factory=dict)
    source: str = field(default=CONFIG_NAME, compare=False, repr=False)
    use_dora: bool = False

    @classmethod
    def read(cls, path: Path, dora: bool = False) -> LoraConfig:
        """Parse and validate ``path`` (an ``adapter_config.json``); refuse what is not plain LoRA.

        The JSON is read strictly (``safe_parse.load_json``: no NaN/Infinity, bounded size, depth and
        digits) and every field vecmerge relies on is type-checked, so a hostile config is one
        AdapterError line (exit 2), never a crash, a hang or a silent NaN. With ``dora`` a DoRA config
        (``use_dora``) is read too, for a reader that forms its effective update from the base weights
        (``workspace/dora.py``); everything else refuses it.
        """
        check_regular(path)
        if not path.is_file():
            raise AdapterError(f"{path}: no {CONFIG_NAME}; point at a PEFT LoRA folder saved by save_pretrained")
        try:
            raw = load_json(path, max_bytes=CONFIG_MAX_BYTES)
        except ParseError as e:
            raise AdapterError(str(e)) from None
        if not isinstance(raw, dict):
            raise AdapterError(f"{path}: expected a JSON object; restore the file from the training run")
        ptype = str(raw.get("peft_type", "LORA")).upper()
        if ptype != "LORA":
            raise AdapterError(f"{path}: peft_type is {ptype[:40]}; vecmerge handles LoRA adapters only")
        for key, why in UNSUPPORTED.items():
            if raw.get(key) and not (key == "use_dora" and dora):
                hint = (" (merge and refactor read a DoRA adapter as its effective update with --base-model)"
                        if key == "use_dora" else "")
                raise AdapterError(f"{path}: {key} is set: {why}; vecmerge handles plain LoRA only{hint}")
        if raw.get("use_dora") and raw.get("fan_in_fan_out"):
            raise AdapterError(f"{path}: DoRA with fan_in_fan_out (Conv1D layers) is not supported")
        init = str(raw.get("init_lora_weights", "")).lower()
        if init.startswith(BASE_CHANGING_INITS):
            raise AdapterError(
                f"{path}: init_lora_weights={short(raw['init_lora_weights'], 40)} changes the base weights, so B@A "
                "is not the update; convert it with save_pretrained(path_initial_model_for_weight_conversion=...)"
            )
        problems = _field_problems(raw)
        if problems:
            raise AdapterError(f"{path}: invalid " + ", ".join(problems) + "; fix the config")
        cfg = cls(r=raw["r"], lora_alpha=float(raw["lora_alpha"]), use_rslora=bool(raw.get("use_rslora", False)),
                  rank_pattern=dict(raw.get("rank_pattern") or {}), alpha_pattern=dict(raw.get("alpha_pattern") or {}),
                  fan_in_fan_out=bool(raw.get("fan_in_fan_out", False)),
                  base_model=raw.get("base_model_name_or_path"), target_modules=raw.get("target_modules"),
                  modules_to_save=list(raw.get("modules_to_save") or []), raw=raw, source=str(path),
                  use_dora=bool(raw.get("use_dora")))
        _ = cfg._patterns  # check every rank/alpha key now: a bad one names this file (PatternError, exit 2)
        return cfg

    @cached_property
    def _patterns(self) -> tuple[PatternSet, PatternSet]:
        return (PatternSet(self.rank_pattern, field="rank_pattern", source=self.source),
                PatternSet(self.alpha_pattern, field="alpha_pattern", source=self.source))

    def resolve(self, module: str) -> tuple[int, float]:
        """(r, alpha) for ``module`` as PEFT resolves them: first matching pattern, else the defaults."""
        rk, ak = self._patterns[0].first_key(module), self._patterns[1].first_key(module)
        r = self.rank_pattern[rk] if rk is not None else self.r
        alpha = self.alpha_pattern[ak] if ak is not None else self.lora_alpha
        return int(r), float(alpha)

    def scale(self, module: str) -> float:
        """The scale PEFT applies to ``module``'s ``B @ A``."""
        r, alpha = self.resolve(module)
        return peft_scale(alpha, r, self.use_rslora)

    @property
    def scale_rule(self) -> str:
        return "alpha/sqrt(r) (rsLoRA)" if self.use_rslora else "alpha/r"

def _is_int(x) -> TypeGuard[int]:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _str_or_strs(x) -> bool:
    return x is None or isinstance(x, str) or (isinstance(x, list) and all(isinstance(v, str) for v in x))


def _field_problems(raw: dict) -> list[str]:
    """What is wrong with the fields vecmerge reads, each as ``name=value (what it must be)``."""
    problems = []
    r, alpha = raw.get("r"), raw.get("lora_alpha")
    if not _is_int(r) or not 1 <= r <= MAX_RANK:
        problems.append(f"r={short(r, 40)} (a positive integer up to {MAX_RANK})")
    if not _is_number(alpha):
        problems.append(f"lora_alpha={short(alpha, 40)} (a finite number)")
    rp, ap = raw.get("rank_pattern") or {}, raw.get("alpha_pattern") or {}
    if not isinstance(rp, dict) or not all(_is_int(v) and 1 <= v <= MAX_RANK for v in rp.values()):
        problems.append("rank_pattern (a mapping of regex to positive integers)")
    if not isinstance(ap, dict) or not all(_is_number(v) for v in ap.values()):
        problems.append("alpha_pattern (a mapping of regex to finite numbers)")
    for key in ("use_rslora", "fan_in_fan_out", "lora_bias"):
        if raw.get(key) is not None and not isinstance(raw[key], bool):
            problems.append(f"{key}={short(raw[key], 40)} (true or false)")
    if raw.get("base_model_name_or_path") is not None and not isinstance(raw["base_model_name_or_path"], str):
        problems.append(f"base_model_name_or_path={short(raw['base_model_name_or_path'], 40)} (a string)")
    for key in ("target_modules", "exclude_modules", "layers_pattern"):
        if not _str_or_strs(raw.get(key)):
            problems.append(f"{key}={short(raw[key], 40)} (a regex string or a list of names)")
    layers = raw.get("layers_to_transform")
    if layers is not None and not _is_int(layers) and not (isinstance(layers, list) and all(map(_is_int, layers))):
        problems.append(f"layers_to_transform={short(layers, 40)} (a layer index or a list of them)")
    mts = raw.get("modules_to_save")
    if mts is not None and not (isinstance(mts, list) and all(isinstance(v, str) for v in mts)):
        problems.append(f"modules_to_save={short(mts, 40)} (a list of module names)")
    return problems


def factor_keys(module: str, kind: str) -> tuple[str, str]:
    """The keys PEFT saves a module's (A, B) under: ``base_model.model.<module>.lora_A.weight`` etc.

    Args:
        module (str): module path, e.g. ``model.layers.0.self_attn.q_proj``. kind (str): linear | embedding.
    """
    a, b = ("lora_embedding_A", "lora_embedding_B") if kind == "embedding" else ("lora_A.weight", "lora_B.weight")
    return f"{PREFIX}{module}.{a}", f"{PREFIX}{module}.{b}"


def module_layer(name: str) -> int | None:
    """The layer index of a module name: the first all-digit path component (``layers.3`` -> 3)."""
    for part in name.split("."):
        if part.isdigit():
            return int(part)
    return None


def type_path(name: str) -> str:
    """What a module is within its layer: the components after the layer index (``attn.c_proj``).

    A module without a layer index (``transformer.wte``, ``lm_head``) is its whole name.
    """
    parts = name.split(".")
    for i, part in enumerate(parts):
        if part.isdigit() and i + 1 < len(parts):
            return ".".join(parts[i + 1:])
    return name


def module_types(names, specs: dict | None = None) -> dict[str, str]:
    """``{module: type label}``: the shortest suffix of its ``type_path`` that no other type path ends with.

    ``q_proj`` stays ``q_proj``; GPT-2's ``attn.c_proj`` and ``mlp.c_proj`` stay apart (both end in
    ``c_proj``); ``transformer.wte`` becomes ``wte``. Distinct type paths always get distinct labels.
    An expert of a MoE parameter (``specs[m].expert`` set) is labelled by its parameter's target
    (``mlp.experts.gate_up_proj`` -> ``gate_up_proj``), so all experts of a parameter share a type.

    Args:
        names (iterable[str]): module names, e.g. ``transformer.h.0.attn.c_proj``.
        specs (dict[str, ModuleSpec] | None): layouts, to recognise experts.
    """
    names = list(names)
    specs = specs or {}
    key = {m: specs[m].target if m in specs and getattr(specs[m], "expert", None) is not None else m for m in names}
    paths = {m: type_path(key[m]) for m in names}
    split = {p: p.split(".") for p in set(paths.values())}
    label = {}
    for p, parts in split.items():
        others = [q for o, q in split.items() if o != p]
        k = next((k for k in range(1, len(parts)) if not any(q[-k:] == parts[-k:] for q in others)), len(parts))
        label[p] = ".".join(parts[-k:])
    return {m: label[paths[m]] for m in names}


def targeted(raw: dict, module: str, source=CONFIG_NAME) -> bool:
    """Whether PEFT's ``check_target_module_exists`` rule picks ``module`` under this config.

    Regex strings (``target_modules``, ``exclude_modules``, ``layers_pattern``) are checked and matched
    under a time budget (``safe_pattern``); a value of the wrong type or a bad regex is a PatternError
    or AdapterError naming ``source``, never a crash or a hang.

    Args:
        raw (dict): the adapter_config.json. module (str): e.g. ``model.layers.0.self_attn.q_proj``.
        source (str | Path): the config file, for messages.
    """
    problems = [p for p in _field_problems({"r": 1, "lora_alpha": 1, **{k: raw.get(k) for k in _COVERAGE}})]
    if problems:
        raise AdapterError(f"{source}: invalid {few(problems)}; fix the config")

    def full(key: str, regex: str, name: str, wrap=lambda r: r) -> bool:
        rx = check_regex(regex, what=key, source=source, wrap=wrap)
        return first_match([rx], name, full=True, what=lambda i: key, source=source) is not None

    excl = raw.get("exclude_modules")
    if excl and (full("exclude_modules", excl, module) if isinstance(excl, str)
                 else module in excl or any(module.endswith(f".{k}") for k in excl)):
        return False
    tm = raw.get("target_modules")
    if isinstance(tm, str):
        return tm == "all-linear" or full("target_modules", tm, module)
    if not tm or module in tm:
        return bool(tm)
    if not any(module.endswith(f".{k}") for k in tm):
        return False
    layers = raw.get("layers_to_transform")
    if layers is None or layers == []:
        return True
    pats = raw.get("layers_pattern") or [r"[^.]*"]
    for pat in [pats] if isinstance(pats, str) else pats:
        rx = check_regex(pat, what="layers_pattern", source=source, wrap=lambda p: rf"(?:^|.*?\.){p}\.(?P<idx>\d+)\..*")
        i = first_match([rx], module, full=True, what=lambda i: "layers_pattern", source=source)
        if i is not None:
            m = rx.fullmatch(module)
            idx = int(m["idx"]) if m is not None else -1
            return idx == layers if isinstance(layers, int) else idx in layers
    return False
