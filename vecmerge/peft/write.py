"""Writing a PEFT LoRA folder: the factors, ``adapter_config.json``, and the manifest and card it is given.

Every module is written with its scale folded so that PEFT's own ``lora_alpha / r`` reproduces the
update: ranks that differ from the default go through ``rank_pattern`` and ``alpha_pattern``, whose
keys are checked to resolve (by PEFT's rule) to exactly the intended rank and alpha.
``write_adapter`` fills a folder staged by ``outputs.transaction.OutputTransaction``, which decides what
may be replaced and moves every output of a run into place together (all or none); inputs are never
opened for writing. The manifest's common part and the model card's front matter come from
``outputs.manifest`` and ``outputs.card``.

Parameters adapted through ``target_parameters`` are written back in PEFT's layout: the experts of a
3-D parameter stacked into one lora_A (E*r, in) and lora_B (out, r*E) under PEFT's nested wrapper
keys (``pack_params``), with one r and one alpha per parameter, resolved on ``<module>.<parameter>``.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import OutputError
from ..io.hashing import sha256_file
from ..io.safetensors_read import DTYPE_CODES
from ..io.safetensors_write import SafetensorsStream
from ..linalg.lowrank import COMPUTE_DTYPE, LowRank, max_abs
from ..outputs.card import CARD_NAME
from ..outputs.manifest import MANIFEST_NAME, adapter_files, finish, write_manifest
from .format import (
    BIAS_KEY,
    CONFIG_NAME,
    DTYPES,
    PREFIX,
    SAFETENSORS_NAME,
    LoraConfig,
    factor_keys,
    peft_scale,
)
from .params import stack_experts, wrapped_keys
from .spec import ModuleSpec

OUTPUT_FILES = (CONFIG_NAME, SAFETENSORS_NAME, MANIFEST_NAME, CARD_NAME)  # all an output folder holds
# Config keys copied from the template only when the module set is the template's own.
_COVERAGE_KEYS = ("target_modules", "layers_to_transform", "layers_pattern", "exclude_modules")


@dataclass(frozen=True)
class WrittenModule:
    """What one module became on disk.

    Args:
        lowrank (LowRank): the factors as stored (after dtype rounding), with PEFT's scale.
        rank (int): stored r. alpha (float): stored lora_alpha.
    """

    lowrank: LowRank
    rank: int
    alpha: float


def _alpha_for(x: LowRank, r: int, keep_factors: bool = False) -> tuple[LowRank, float]:
    """Choose lora_alpha so that PEFT's ``alpha / r`` equals ``x.scale``.

    With ``keep_factors`` the factors are never touched (alpha is nudged by an ulp if needed);
    otherwise a scale that ``alpha / r`` cannot hit exactly is folded into B and alpha = r.
    """
    if x.scale == 1.0:
        return x, float(r)
    alpha = x.scale * r
    for cand in (alpha, math.nextafter(alpha, math.inf), math.nextafter(alpha, -math.inf)):
        if peft_scale(cand, r, False) == x.scale:
            return x, cand
    if keep_factors:
        return x, alpha
    return LowRank(x.B * x.scale, x.A, 1.0), float(r)


def _patterns(ranks: dict, alphas: dict) -> tuple[int, float, dict, dict]:
    """Default r/alpha (the most common) and the pattern entries needed for the others."""
    r0 = Counter(ranks.values()).most_common(1)[0][0]
    a0 = Counter(a for m, a in alphas.items() if ranks[m] == r0).most_common(1)[0][0]
    rp = {m: r for m, r in ranks.items() if r != r0}
    ap = {m: a for m, a in alphas.items() if a != a0}
    # PEFT matches a key k as re.match(rf"(.*\.)?({k})$", name): plain names (as PEFT itself writes),
    # else escaped, else anchored with ^ so that no longer name ending in this one matches too.
    for key in (lambda m: m, re.escape, lambda m: "^" + re.escape(m)):
        rpk = {key(m): r for m, r in rp.items()}
        apk = {key(m): a for m, a in ap.items()}
        cfg = LoraConfig(r=r0, lora_alpha=a0, rank_pattern=rpk, alpha_pattern=apk)
        if all(cfg.resolve(m) == (ranks[m], alphas[m]) for m in ranks):
            return r0, a0, rpk, apk
    raise OutputError("cannot express the per-module ranks with PEFT's rank_pattern (module names that "
                      "PEFT's suffix match cannot tell apart); use a fixed --rank N")


def build_config(template: LoraConfig | None, specs: dict, ranks: dict, alphas: dict,
                 same_modules: bool, lora_bias: bool = False) -> dict:
    """The ``adapter_config.json`` for the written modules (plain LoRA, rsLoRA off, patterns exact; ``lora_bias``
    set when every module stores a ``lora_B.bias``)."""
    raw = dict(template.raw) if template is not None else {"peft_type": "LORA", "task_type": "CAUSAL_LM"}
    r0, a0, rp, ap = _patterns(ranks, alphas)
    raw.update(peft_type="LORA", r=int(r0), lora_alpha=a0, use_rslora=False, rank_pattern=rp,
               alpha_pattern=ap, use_dora=False, fan_in_fan_out=any(
                   s.transposed and s.kind == "linear" for s in specs.values()),
               modules_to_save=None, inference_mode=True, init_lora_weights=True)
    raw.pop("lora_bias", None)
    if lora_bias:
        raw["lora_bias"] = True
    if not same_modules or template is None:
        for key in _COVERAGE_KEYS:
            raw.pop(key, None)
        # full names: PEFT targets exactly these modules (and these parameters)
        raw["target_modules"] = sorted(m for m, s in specs.items() if not s.param)
        wrapped = sorted({s.target for s in specs.values() if s.param})
        if wrapped or raw.get("target_parameters"):
            raw["target_parameters"] = wrapped or None
    return raw


def prepare_modules(modules: dict, specs: dict, dtype: str = "fp32", keep_factors: tuple = ()):
    """The tensors to store and what each module becomes after dtype rounding (no file I/O).

    Args:
        modules (dict[str, LowRank]): module -> update. specs (dict[str, ModuleSpec]): layouts.
        dtype (str): fp32, bf16 or fp16. keep_factors (tuple[str]): modules never refolded.

    Returns:
        (tensors, written): the safetensors dict and {module: WrittenModule}.
    """
    tdtype = DTYPES[dtype]
    keep = set(keep_factors)
    tensors, written = {}, {}
    for name, x in modules.items():
        spec: ModuleSpec = specs[name]
        if x.rank == 0:  # PEFT needs r >= 1: a zero column and row
            x = LowRank(torch.zeros(x.shape[0], 1, dtype=COMPUTE_DTYPE),
                        torch.zeros(1, x.shape[1], dtype=COMPUTE_DTYPE), 1.0)
        x, alpha = _alpha_for(x, x.rank, name in keep)
        B = x.B.to(device="cpu", dtype=tdtype).contiguous()
        A = x.A.to(device="cpu", dtype=tdtype).contiguous()
        if not (math.isfinite(max_abs(B)) and math.isfinite(max_abs(A))):
            big = max(float(x.B.abs().max()), float(x.A.abs().max()))
            fix = ("use --dtype fp32 (or bf16, which has fp32's range)" if dtype == "fp16" else
                   "the update is too large for any stored dtype; scale the expression's coefficients down")
            raise OutputError(f"module {name}: factors up to {big:.3g} overflow {dtype}; {fix}")
        if not spec.param:  # wrapped parameters are stored by pack_params, which sees all of a module's
            a_key, b_key = factor_keys(name, spec.kind)
            tensors[a_key] = A
            tensors[b_key] = B
        written[name] = WrittenModule(LowRank(B, A, peft_scale(alpha, x.rank, False)), x.rank, alpha)
    return tensors, written


def bias_tensor(name: str, bias: torch.Tensor, written: WrittenModule, dtype: str) -> tuple[str, torch.Tensor]:
    """``(key, lora_B.bias)`` that PEFT's scale of the written module turns into the bias update ``bias``."""
    t = (bias / written.lowrank.scale).to(device="cpu", dtype=DTYPES[dtype]).contiguous()
    if not bool(torch.isfinite(t).all()):
        raise OutputError(f"module {name}: its lora_B.bias overflows {dtype}; use --dtype fp32 or smaller coefficients")
    return BIAS_KEY.format(prefix=PREFIX, module=name), t


def pack_params(written: dict, specs: dict) -> dict:
    """The tensors of the ``target_parameters`` modules of ``written``, in PEFT's layout and nesting.

    The experts of a parameter must be complete and share one rank and alpha (``pipeline.build`` cuts
    them at a common rank); lora_A stacks them expert-major, lora_B expert-minor (``stack_experts``).

    Args:
        written (dict[str, WrittenModule]): every written module (others are ignored).
        specs (dict[str, ModuleSpec]): their layouts.

    Returns:
        ``{key: tensor}`` for the wrapped parameters (empty for an adapter without any).
    """
    groups: dict[str, list] = {}
    for m in written:
        if specs[m].param:
            groups.setdefault(specs[m].target, []).append(m)
    params: dict[str, set] = {}
    for names in groups.values():
        params.setdefault(specs[names[0]].holder, set()).add(specs[names[0]].param)
    tensors = {}
    for target, names in groups.items():
        s0 = specs[names[0]]
        a_key, b_key = wrapped_keys(s0.holder, s0.param, params[s0.holder])
        if s0.kind != "expert":
            w = written[names[0]]
            tensors[a_key], tensors[b_key] = w.lowrank.A, w.lowrank.B
            continue
        by_e = {specs[m].expert: written[m] for m in names}
        if sorted(by_e) != list(range(s0.experts)):
            raise OutputError(f"parameter {target}: {len(by_e)} of its {s0.experts} experts to write; "
                              "PEFT stores all of them in one tensor")
        if len({(w.rank, w.alpha) for w in by_e.values()}) > 1:
            raise OutputError(f"parameter {target}: experts of ranks {sorted({w.rank for w in by_e.values()})} "
                              "and alphas differ; PEFT stores one r and one alpha per parameter")
        A, B = stack_experts([(by_e[e].lowrank.B, by_e[e].lowrank.A) for e in range(s0.experts)])
        tensors[a_key], tensors[b_key] = A, B
    return tensors


def weights_stream(path, specs: dict, dtype: str, names, extra_rank: dict | None = None,
                   biases: bool = False) -> SafetensorsStream:
    """The adapter's safetensors file, streamed module by module (``SafetensorsStream``) in ``names`` order.

    Each module's rank is bounded by ``min(out, in)`` (plus ``extra_rank[m]``: keep-base appends the
    backbone's own factors), which is all the header's room needs.

    Args:
        path (Path): the file to create. specs (dict[str, ModuleSpec]): layouts. dtype (str): fp32, bf16 or fp16.
        names (Iterable[str]): the modules, in file order. extra_rank (dict[str, int] | None): see above.
        biases (bool): every module also stores its ``lora_B.bias`` (``bias_tensor``).
    """
    code = DTYPE_CODES[DTYPES[dtype]]
    groups = []
    for m in names:
        out, inn = specs[m].shape
        r = max(1, min(out, inn) + (extra_rank or {}).get(m, 0))
        a_key, b_key = factor_keys(m, specs[m].kind)
        bias = [(BIAS_KEY.format(prefix=PREFIX, module=m), code, (out,))] if biases else []
        groups.append((m, [(a_key, code, (r, inn)), (b_key, code, (out, r)), *bias]))
    return SafetensorsStream(path, groups, {"format": "pt"})


def write_tensors(path, tensors: dict) -> str:
    """Write ``{key: tensor}`` as a safetensors file (in that order); returns its sha256."""
    stream = SafetensorsStream(path, [(k, [(k, DTYPE_CODES[t.dtype], tuple(t.shape))]) for k, t in tensors.items()],
                               {"format": "pt"})
    try:
        for k, t in tensors.items():
            stream.put(k, {k: t})
        return stream.close()
    except BaseException:
        stream.abort()
        raise


def write_adapter(folder, written: dict, specs: dict, *, weights_sha256: str | None = None,
                  tensors: dict | None = None, template: LoraConfig | None, manifest: dict, card: str,
                  dtype: str = "fp32", same_modules: bool = True, lora_bias: bool = False) -> dict:
    """Complete a PEFT LoRA folder in ``folder`` (empty but for a streamed weights file: staged by
    ``OutputTransaction``): the weights (unless streamed), config, manifest and model card.

    Args:
        folder (str | Path): the folder to fill (``txn.folder(out)``); the transaction moves it into place.
        written (dict[str, WrittenModule]): what each module became (its stored rank and alpha).
        specs (dict[str, ModuleSpec]): layout of each module (kind, transposed).
        weights_sha256 (str | None): the sha256 of ``adapter_model.safetensors`` already streamed into
            ``folder`` (``weights_stream``); else ``tensors`` (dict[str, Tensor]) are written here.
        template (LoraConfig | None): config to start from (base model, task type, coverage).
        manifest (dict): written as ``vecmerge.json``, closed by ``outputs.manifest.finish`` (``vecmerge_version``
            and ``output``: the files' sha256s, the dtype, the module count).
        card (str): the README.md model card.
        dtype (str): the dtype the factors were rounded to (recorded in the manifest).
        same_modules (bool): the module set equals the template's (keep its target_modules).
        lora_bias (bool): the weights hold every module's ``lora_B.bias`` (``lora_bias: true`` in the config).

    Returns:
        dict with ``sha256`` of the weights file and ``config``. A full disk or another write failure is
        an OSError (``OutputTransaction`` turns it into one OutputError line naming the output, and keeps
        nothing).
    """
    folder = Path(folder)
    ranks = {specs[m].target: w.rank for m, w in written.items()}  # experts of a parameter share one r
    alphas = {specs[m].target: w.alpha for m, w in written.items()}
    config = build_config(template, specs, ranks, alphas, same_modules, lora_bias)
    sha = weights_sha256 if weights_sha256 is not None else write_tensors(folder / SAFETENSORS_NAME, tensors or {})
    (folder / CONFIG_NAME).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    (folder / CARD_NAME).write_text(card)
    output = {**adapter_files(folder, SAFETENSORS_NAME, CONFIG_NAME, sha),
              "card_sha256": sha256_file(folder / CARD_NAME), "dtype": dtype, "modules": len(written)}
    write_manifest(folder, finish(manifest, output))
    return {"sha256": sha, "config": config}
