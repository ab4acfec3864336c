"""``vecmerge fuse``: a LoRA adapter added into its base model's weights, written as a plain model.

For every LoRA module m with update ``D_m = scale * B @ A`` (in the base layout) and base weight ``W_m``::

    fused_m = round_dtype(W_m + D_m)        (the sum in float64 for fp32 outputs, float32 for bf16/fp16)
    rounding_rel = ||fused - (W + D)|| / ||D||   (recorded: how much of the update the rounding lost)

in row blocks of ``BLOCK_BYTES``. ``modules_to_save`` tensors replace the base's; every other tensor is
copied byte for byte (converted only for ``--dtype``); shard names, tensor order, ``__metadata__``, the index
and the base's other top-level files are kept. ``vecmerge.json`` (``kind: fuse``) records every hash and per
module ``||D||`` and ``rounding_rel``; its paths are relative to the workspace (``workspace``: that folder
relative to the output). Written by ``outputs.transaction.OutputTransaction``.
What is copied, and why a float32 sum suffices: docs/design/models.md.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import AdapterError, ModelError, UsageError, few
from ..io.hashing import sha256_file
from ..io.model_folder import CONFIG, INDEX_NAME, ModelFolder
from ..io.safetensors_read import DTYPE_CODES, ST_DTYPES, itemsize, to_tensor
from ..io.safetensors_write import SafetensorsWriter, tensor_bytes, write_index
from ..outputs.card import CARD_NAME, model_card
from ..outputs.manifest import MANIFEST_NAME, finish, portable, stamp, write_manifest
from ..outputs.transaction import OutputPolicy, OutputTransaction
from ..peft.adapter import Adapter
from ..peft.format import DTYPES, PREFIX
from ..results import Result
from .extract import TIED_HEAD, tied_embedding

BLOCK_BYTES = 64 << 20
TORCH_DTYPE_NAMES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
SKIPPED_FILES = ("README.md", MANIFEST_NAME)


@dataclass(frozen=True, eq=False)
class FuseReport(Result):
    """``vecmerge fuse``'s result (``--json``: ``to_dict()``): the manifest it wrote (``vecmerge.json``), ``out``.

    Args:
        tool, created, kind (str): ``stamp("fuse")``. workspace (str): the workspace folder relative to ``out``.
        inputs (dict): the base's and the adapter's paths (relative to the workspace) and hashes.
        settings (dict): dtype (None: stored dtypes). modules (dict): per module ``||D||`` and ``rounding_rel``.
        saved (dict): base tensors replaced by the adapter's modules_to_save. figures (dict): counts, rounding,
            seconds. vecmerge_version (str). output (dict): shards, hashes, copied files, config edits.
        out (str): the folder.
    """

    tool: str
    created: str
    kind: str
    workspace: str
    inputs: dict
    settings: dict
    modules: dict
    saved: dict
    figures: dict
    vecmerge_version: str
    output: dict
    out: str


def base_tensor(base: ModelFolder, name: str) -> str | None:
    """The base tensor ``name`` refers to: itself, or with its first component dropped (``transformer.``)."""
    if name in base.tensors:
        return name
    short = name.split(".", 1)[1] if "." in name else None
    return short if short in base.tensors else None


def work_dtype(out_dtype: torch.dtype) -> torch.dtype:
    """The precision of the sum: float64 for fp32 (and fp64) outputs, float32 for bf16 and fp16 ones."""
    return torch.float64 if out_dtype in (torch.float32, torch.float64) else torch.float32


def fused_weight(W: torch.Tensor, B: torch.Tensor, A: torch.Tensor, scale: float, transposed: bool,
                 out_dtype: torch.dtype) -> tuple[torch.Tensor, float, float]:
    """``round(W + D)`` with ``D = scale * B @ A`` (transposed when the layout says), in row blocks.

    The sum is formed in ``work_dtype(out_dtype)`` (``addmm``: one BLAS call adds the product to W) and
    rounded to ``out_dtype``. For a bf16 or fp16 output the float32 sum's own error (2^-24 relative) is 1/2^16
    (bf16) or 1/2^13 (fp16) of the output's rounding step, so the result is the float64 sum rounded once
    but for values that fall that close to a rounding tie (one ulp off there; ``verify`` allows one ulp).

    Args:
        W (Tensor): the base weight, as stored. B (Tensor): (out, r). A (Tensor): (r, in). scale (float).
        transposed (bool): W holds ``(B @ A).T``. out_dtype (torch.dtype): the stored dtype of the result.

    Returns:
        (fused, ``||D||_F^2`` (float64, from the factors: ``s^2 sum (B^T B) * (A A^T)``),
        ``||fused - (W + D)||_F^2`` (in the working precision)).
    """
    work = work_dtype(out_dtype)
    B64, A64 = B.to(torch.float64) * scale, A.to(torch.float64)
    d_sq = float(((B64.T @ B64) * (A64 @ A64.T)).sum())
    left, right = B64.to(work), A64.to(work)
    if transposed:
        left, right = right.T.contiguous(), left.T.contiguous()
    rows, cols = W.shape
    out = torch.empty(W.shape, dtype=out_dtype)
    step = max(1, BLOCK_BYTES // (8 * max(cols, 1)))
    e_sq = 0.0
    for i in range(0, rows, step):
        acc = W[i:i + step].to(work, copy=True)  # never W itself: its bytes may still be being hashed
        acc.addmm_(left[i:i + step], right)
        block = out[i:i + step]
        block.copy_(acc)
        acc.sub_(block)
        e_sq += float(torch.linalg.vector_norm(acc)) ** 2
    return out, max(d_sq, 0.0), e_sq


def _saved_tensors(a: Adapter, base: ModelFolder) -> tuple[dict, list]:
    """``({base tensor: adapter key}, [tied head keys])`` of the adapter's modules_to_save.

    A saved ``lm_head.weight`` for a base whose head is tied to its token embedding (and so not stored) is
    skipped when it equals the saved embedding (``extract`` writes it so for PEFT); else it is an error.
    """
    out, tied = {}, []
    emb = tied_embedding(base)
    for key in a.saved_keys:
        name = base_tensor(base, re.sub(r"\.modules_to_save\.[^.]+", "", key.removeprefix(PREFIX)))  # older PEFT
        if name is None and emb is not None and key == f"{PREFIX}{TIED_HEAD}.weight":
            tied.append(key)
            continue
        if name is None:
            raise ModelError(f"{a.weights_path}: saved tensor {key} has no counterpart in the base model; the adapter "
                             "was trained on another model")
        out[name] = key
    if tied:
        if emb not in out or not torch.equal(a.tensor(tied[0]), a.tensor(out[emb])):
            raise ModelError(f"{a.weights_path}: saves a head {tied[0]} other than its embedding, but the base "
                             f"ties the head to {emb}; a fused model cannot hold both")
    return out, tied


def _parameter_refusal(a: Adapter, base: ModelFolder, specs: list) -> ModelError:
    """Why an adapter of ``target_parameters`` (MoE experts, a router's parameter) cannot be fused: transformers
    adapts the parameters of its in-memory modules (``mlp.experts.gate_up_proj``: all experts in one), but
    saves its own layout (Mixtral: ``block_sparse_moe.experts.<e>.w1.weight``, one tensor per expert), which
    fuse does not map; never "trained on another model", which is not the cause."""
    params = sorted({f"{s.holder}.{s.param}" for s in specs})
    stored = next((n for n in base.in_file_order() if ".experts." in n), None)
    layout = f" (this base stores e.g. {stored})" if stored else ""
    return ModelError(f"{a.path}: adapts {len(params)} parameter(s) through target_parameters (MoE experts or a "
                      f"router: {few(params, 3)}), which the base model does not store under those names: "
                      f"transformers saves its own per-expert layout{layout}, which fuse does not map; fuse it with "
                      "PEFT instead (PeftModel.from_pretrained(base, adapter).merge_and_unload(), then "
                      "save_pretrained)")


def plan(a: Adapter, base: ModelFolder) -> tuple[dict, dict]:
    """``({base tensor: module}, {base tensor: saved key})``, every shape checked against the base's.

    Experts of a ``target_parameters`` adapter (a slice of a 3-D parameter each), and a parameter the base
    does not store under its in-memory name, are refused naming target_parameters (``_parameter_refusal``)."""
    unmapped = [s for s in a.specs.values() if s.param is not None and (
        s.kind == "expert" or base_tensor(base, f"{s.name}.weight") is None)]
    if unmapped:
        raise _parameter_refusal(a, base, unmapped)
    mods = {}
    for m, spec in a.specs.items():
        name = base_tensor(base, f"{m}.weight")
        if name is None:
            raise ModelError(f"{a.path}: module {m} has no weight {m}.weight in the base model {base.path}; the "
                             "adapter was trained on another model")
        if tuple(base.info(name).shape) != tuple(spec.weight_shape):
            raise ModelError(f"{a.path}: module {m} updates a {spec.weight_shape} weight, the base's {name} is "
                             f"{base.info(name).shape}; the adapter was trained on another model")
        mods[name] = m
    saved, _ = _saved_tensors(a, base)
    return mods, saved


def fuse(adapter, base_model, out, *, dtype: str | None = None, force: bool = False,
         progress=None, home=None) -> FuseReport:
    """Fuse ``adapter`` into ``base_model`` and write the model to ``out`` (see the module docstring).

    Args:
        adapter (str | Path): a PEFT LoRA folder. base_model (str | Path): its base model folder (safetensors).
        out (str | Path): the model folder to write. dtype (str | None): fp32 | bf16 | fp16 for every floating
            tensor, or None to keep each tensor's stored dtype. force (bool). progress: wraps an iterable.
        home (str | Path | None): the workspace folder the manifest's paths start from (default: the current one).

    Returns:
        FuseReport: the manifest with ``out``.
    """
    t0 = time.perf_counter()
    if dtype is not None and dtype not in DTYPES:
        raise UsageError(f"--dtype {dtype}: use one of {', '.join(DTYPES)}")
    policy = OutputPolicy.for_command(inputs=[adapter, base_model], force=force)
    policy.check_folder(out)
    a = Adapter(adapter, modules_to_save="drop")
    if a.bias_keys:
        raise AdapterError(f"{a.path}: lora_bias is set: fuse folds B@A into the weights and would drop its trained "
                           "bias; merge it with PEFT's merge_and_unload, or train without lora_bias")
    base = ModelFolder(base_model)
    try:
        mods, saved = plan(a, base)
        if saved:
            _check_saved_format(a)
        with OutputTransaction(policy) as txn:
            tmp = txn.folder(out)
            man = _write(tmp, a, base, mods, saved, dtype, progress,
                         (Path(out).resolve(), Path(home or Path.cwd()).resolve()))
            man["figures"]["seconds"] = time.perf_counter() - t0
            (tmp / CARD_NAME).write_text(model_card(None, f"{base.path.name} with {a.path.name} fused in",
                                                    card_body(man)))
            man["output"]["card_sha256"] = sha256_file(tmp / CARD_NAME)  # verify: the card as written
            write_manifest(tmp, man)
            txn.commit()
    finally:
        base.close()
    return FuseReport(**man, out=str(out))


def _piece(info, nbytes: int):
    """A flat TensorInfo for ``nbytes`` of ``info``'s bytes (to view a piece as elements)."""
    return type(info)(info.name, info.dtype, (nbytes // itemsize(info.dtype),), info.file, 0, nbytes)


def _check_saved_format(a: Adapter) -> None:
    if a.weights_path.suffix != ".safetensors":
        raise ModelError(f"{a.weights_path}: modules_to_save in a .bin adapter; save the adapter as safetensors")


def _out_code(code: str, dtype: str | None) -> str:
    if dtype is None or code not in ("F64", "F32", "F16", "BF16"):
        return code
    return DTYPE_CODES[DTYPES[dtype]]


def _write(tmp: Path, a: Adapter, base: ModelFolder, mods: dict, saved: dict, dtype, progress,
           where: tuple) -> dict:
    """Every tensor and file of the fused model into ``tmp``; the manifest (``where``: (output, workspace))."""
    out, home = where
    files: dict[str, str] = {}
    modules: dict[str, dict] = {}
    copied = converted = 0
    total_size, wmap = 0, {}
    order = base.in_file_order()
    it = iter(progress(order) if progress else order)
    for f in base.files:
        names = [n for n in base.in_file_order() if base.info(n).file == f.index]
        entries = [(n, _out_code(base.info(n).dtype, dtype), base.info(n).shape) for n in names]
        w = SafetensorsWriter(tmp / f.path.name, entries, f.metadata)
        try:
            for n, code, _ in entries:
                next(it, None)
                info = base.info(n)
                if n in mods:
                    m = mods[n]
                    lr = a.factors(m)
                    fused, d_sq, e_sq = fused_weight(base.read(n), lr.B, lr.A, lr.scale, a.specs[m].transposed,
                                                     ST_DTYPES[code])
                    modules[m] = {"tensor": n, "shape": list(info.shape), "delta_norm": math.sqrt(d_sq),
                                  "rounding_rel": math.sqrt(e_sq / d_sq) if d_sq > 0 else math.sqrt(e_sq)}
                    w.write(n, fused)
                elif n in saved:
                    t = a.tensor(saved[n])
                    if tuple(t.shape) != tuple(info.shape):
                        raise ModelError(f"{a.weights_path}: saved {saved[n]} is {tuple(t.shape)}, the base's {n} is "
                                         f"{info.shape} (a resized vocabulary?); resize the base model's embeddings, "
                                         "save it, and fuse into that")
                    w.write(n, t.to(ST_DTYPES[code]))
                elif code == info.dtype:
                    w.write(n, base.read_chunks(n))
                    copied += 1
                else:
                    w.write(n, (tensor_bytes(to_tensor(c, _piece(info, len(c))).to(ST_DTYPES[code]))
                                for c in base.read_chunks(n)))
                    converted += 1
                total_size += math.prod(info.shape) * torch.empty(0, dtype=ST_DTYPES[code]).element_size()
                wmap[n] = f.path.name
            w.close()
        except BaseException:
            w.abort()
            raise
        files[f.path.name] = w.sha256()
    if base.sharded:
        write_index(tmp / INDEX_NAME, wmap, total_size)
    edits = _copy_others(tmp, base, dtype)
    rel = [r["rounding_rel"] for r in modules.values()]
    d_all = sum(r["delta_norm"] ** 2 for r in modules.values())
    e_all = sum((r["rounding_rel"] * r["delta_norm"]) ** 2 for r in modules.values())
    body = {"workspace": portable(home, out),
            "inputs": {"base": {"path": portable(base.path, home), "files": base.sha256s()},
                       "adapter": {"path": portable(a.path, home), "sha256": a.sha256,
                                   "config_sha256": a.config_sha256}},
            "settings": {"dtype": dtype}, "modules": modules, "saved": {n: k for n, k in saved.items()},
            "figures": {"modules": len(modules), "saved": len(saved), "copied": copied, "converted": converted,
                        "tensors": len(base.tensors), "max_rounding_rel": max(rel, default=0.0),
                        "rounding_rel": math.sqrt(e_all / d_all) if d_all > 0 else 0.0}}
    return finish({**stamp("fuse"), **body}, {"files": files, "dtype": dtype, "copied_files": edits["copied"],
                                              "config_edits": edits["config_edits"]})


def _copy_others(tmp: Path, base: ModelFolder, dtype: str | None) -> dict:
    """Copy the base's other files (config.json's dtype set to ``dtype``); returns what was copied and edited."""
    copied, edits = [], {}
    for name in base.other_files():
        if name in SKIPPED_FILES:
            continue
        if name == CONFIG and dtype is not None:
            cfg = dict(base.config)
            for key in ("torch_dtype", "dtype"):
                if key in cfg or (key == "torch_dtype" and "dtype" not in cfg):
                    edits[key] = [cfg.get(key), TORCH_DTYPE_NAMES[dtype]]
                    cfg[key] = TORCH_DTYPE_NAMES[dtype]
            (tmp / name).write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
        else:
            shutil.copyfile(base.path / name, tmp / name)
        copied.append(name)
    return {"copied": copied, "config_edits": edits}


def card_body(manifest: dict) -> str:
    fig, inp = manifest["figures"], manifest["inputs"]
    lines = [f"The LoRA `{inp['adapter']['path']}` fused into `{inp['base']['path']}` by "
             "[vecmerge](https://pypi.org/project/vecmerge/): a plain model, no PEFT needed.", "",
             f"- {fig['modules']} modules updated (W + scale * B @ A summed in float64 for fp32, float32 for "
             "bf16/fp16, rounded to "
             f"{manifest['settings']['dtype'] or 'each tensor’s stored dtype'}); {fig['saved']} tensors replaced by "
             f"the adapter's modules_to_save; {fig['copied']} copied byte for byte",
             f"- rounding moved the update by {fig['rounding_rel']:.3e} of its norm (worst module "
             f"{fig['max_rounding_rel']:.3e})", "", "Inputs (sha256):", "",
             f"- adapter weights: `{inp['adapter']['sha256']}`"]
    lines += [f"- base {n}: `{h}`" for n, h in inp["base"]["files"].items()]
    lines += ["", "`vecmerge verify <this folder>` re-derives every tensor from the base and the adapter."]
    return "\n".join(lines)


__all__ = ["fuse", "FuseReport", "fused_weight", "base_tensor"]
