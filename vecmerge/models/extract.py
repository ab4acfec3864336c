"""``vecmerge extract``: a full fine-tune as a LoRA, module by module, with the exact error of every cut.

For every targeted module m (``parts``)::

    D_m = W_tuned - W_base  (float64, LoRA layout)  ->  B = U sqrt(S), A = sqrt(S) Vh  (lora_alpha = r)
    error_m^2 = ||D_m||^2 - sum S^2                     (``linalg.dense_cut.cut_module``, exact)

Both models are read one tensor at a time; the factors go to a scratch file as they are made. Every other
tensor that differs is listed before any cut and handled as ``others`` says (``save`` as PEFT
``modules_to_save``, ``drop``; neither given and something differs: exit 2 with the list).
What ``save`` cannot keep: docs/design/models.md.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from ..errors import ModelError, UsageError, few
from ..io.model_folder import ModelFolder
from ..io.safetensors_read import CHUNK_BYTES, TensorInfo, itemsize, to_tensor
from ..linalg.dense_cut import cut_module
from ..linalg.rank_policy import RankPolicy
from ..options import EXTRACT_OTHERS
from .parts import ALL_LINEAR, Part, module_of, parts, select

OTHERS = EXTRACT_OTHERS
TIED_HEAD = "lm_head"


@dataclass
class Other:
    """A tensor outside the targets that differs. kind: changed | resized | added | removed."""

    tensor: str
    kind: str
    base_shape: tuple | None
    tuned_shape: tuple | None
    rel_change: float | None = None

    def to_dict(self) -> dict:
        return {"tensor": self.tensor, "kind": self.kind, "base_shape": self.base_shape,
                "tuned_shape": self.tuned_shape, "rel_change": self.rel_change}


@dataclass
class Extraction:
    """What the scan and the cuts found (no files yet).

    Args:
        base, tuned (ModelFolder). targets (dict[str, Part]). policy (RankPolicy). others (list[Other]).
        others_policy (str | None). saved_modules (list[str]): modules_to_save.
        saved_tensors (dict[str, str]): tensor name in the adapter -> the fine-tune's tensor it holds (the
            same name, but for a tied head: ``lm_head.weight`` -> the token embedding).
        modules (dict[str, dict]): per module the manifest record. seed (int).
    """

    base: ModelFolder
    tuned: ModelFolder
    targets: dict
    policy: RankPolicy
    others: list
    others_policy: str | None
    seed: int = 0
    saved_modules: list = field(default_factory=list)
    saved_tensors: dict = field(default_factory=dict)
    modules: dict = field(default_factory=dict)

    @property
    def resized(self) -> list:
        return [o for o in self.others if o.kind == "resized"]

    def figures(self) -> dict:
        """Global kept share and error: ``sum dropped / sum total`` over the modules; rank range."""
        tot = sum(r["total_energy"] for r in self.modules.values())
        drop = sum(r["dropped_energy"] for r in self.modules.values())
        ranks = [r["rank"] for r in self.modules.values()] or [0]
        worst = max(self.modules, key=lambda m: self.modules[m]["rel_error"], default=None)
        return {"modules": len(self.modules), "rank": {"min": min(ranks), "max": max(ranks), "sum": sum(ranks)},
                "total_energy": tot, "dropped_energy": drop, "kept_share": 1 - drop / tot if tot > 0 else 1.0,
                "rel_error": math.sqrt(drop / tot) if tot > 0 else 0.0, "worst_module": worst,
                "max_rel_error": self.modules[worst]["rel_error"] if worst else 0.0,
                "minimal": sum(1 for r in self.modules.values() if r.get("minimal")),
                "others": len(self.others), "saved_modules": len(self.saved_modules)}


def lora_difference(base_t: torch.Tensor, tuned_t: torch.Tensor, part: Part) -> torch.Tensor:
    """``W_tuned - W_base`` in float64, in the LoRA layout (out, in) (one float64 matrix in memory)."""
    D = tuned_t.to(torch.float64, copy=True)  # a copy: the tensor's bytes may still be being hashed
    D.sub_(base_t)
    return D.T if part.transposed else D


def relative_change(base: ModelFolder, tuned: ModelFolder, name: str) -> float | None:
    """None if tensor ``name`` holds the same values in both models, else ``||t - b|| / ||b||`` (float64;
    integer tensors too, by value).

    Read in pieces of ``CHUNK_BYTES`` (an embedding is compared without holding it whole); bytes equal
    means equal; a different dtype is compared by value.
    """
    bi, ti = base.info(name), tuned.info(name)
    if bi.dtype == ti.dtype:
        equal = all(np.array_equal(x, y) for x, y in zip(base.read_chunks(name, feed_hash=False),
                                                         tuned.read_chunks(name, feed_hash=False)))
        if equal:
            return None
    step = CHUNK_BYTES // 8
    elems = math.prod(bi.shape)
    d_sq = n_sq = 0.0
    same = True
    for s in range(0, elems, step):
        e = min(s + step, elems)
        b = _slice(base, bi, s, e).to(torch.float64)
        t = _slice(tuned, ti, s, e).to(torch.float64)
        same = same and torch.equal(t, b)
        d_sq += float(((t - b) ** 2).sum())
        n_sq += float((b * b).sum())
    if same:
        return None
    return math.sqrt(d_sq / n_sq) if n_sq > 0 else math.sqrt(d_sq)


def _slice(model: ModelFolder, info, s: int, e: int) -> torch.Tensor:
    """Elements ``s..e`` of a tensor (flattened), read from its file."""
    k = itemsize(info.dtype)
    part = TensorInfo(info.name, info.dtype, (e - s,), info.file, info.start + s * k, info.start + e * k)
    return to_tensor(model.files[info.file].read_bytes(part, feed_hash=False), part)


def find_others(base: ModelFolder, tuned: ModelFolder, target_weights: set) -> list[Other]:
    """Every tensor outside the targets that differs between the models (values compared, not dtypes)."""
    out = []
    for name in tuned.in_file_order():
        if name in target_weights:
            continue
        t = tuned.info(name)
        if name not in base.tensors:
            out.append(Other(name, "added", None, t.shape))
            continue
        b = base.info(name)
        if b.shape != t.shape:
            out.append(Other(name, "resized", b.shape, t.shape))
            continue
        rel = relative_change(base, tuned, name)
        if rel is not None:
            out.append(Other(name, "changed", b.shape, t.shape, rel))
    out += [Other(n, "removed", base.info(n).shape, None) for n in base.in_file_order()
            if n not in tuned.tensors and n not in target_weights]
    return out


def others_message(others: list) -> str:
    kinds = {k: [o for o in others if o.kind == k] for k in ("changed", "resized", "added", "removed")}
    parts_ = [f"{len(v)} {k}" for k, v in kinds.items() if v]
    resized = "; ".join(f"{o.tensor} {o.base_shape} -> {o.tuned_shape}" for o in kinds["resized"][:2])
    return (f"{len(others)} tensors outside --targets differ between the models ({', '.join(parts_)}: "
            f"{few([o.tensor for o in others], 4)}" + (f"; resized: {resized}" if resized else "") + ")")


def plan_saved(ex: Extraction) -> None:
    """Under ``save``: the modules to save whole (every tensor of each), or a UsageError for what cannot be."""
    if ex.others_policy != "save" or not ex.others:
        return
    bad_one_sided = [o.tensor for o in ex.others if o.kind in ("added", "removed")]
    if bad_one_sided:
        raise UsageError(f"--others save: {few(bad_one_sided)} exist in only one model, which an adapter cannot "
                         "express; pass --others drop to leave them out (they are listed in the manifest)")
    mods = sorted({module_of(o.tensor) for o in ex.others})
    lora = [m for m in mods if m in ex.targets]
    if lora:
        raise UsageError(f"--others save: {few([o.tensor for o in ex.others if module_of(o.tensor) in lora])} "
                         "belong to LoRA-targeted modules, and PEFT saves a module either whole or as LoRA; pass "
                         "--others drop to leave them out, or leave those modules out of --targets")
    everything = set(ex.tuned.tensors) | set(ex.base.tensors)
    all_modules = {p for n in everything for p in _prefixes(n)}
    for m in mods:
        hit = sorted(k for k in all_modules if k.endswith(m) and k != m)
        if hit:
            raise UsageError(f"--others save: PEFT's modules_to_save entry {m!r} would also match {few(hit)}; "
                             "pass --others drop")
    ex.saved_tensors = {n: n for n in sorted(ex.tuned.tensors) if module_of(n) in set(mods)}
    emb = tied_embedding(ex.tuned)
    if emb is not None and emb in ex.saved_tensors:  # the head shares the embedding: save its copy as lm_head
        mods.append(TIED_HEAD)
        ex.saved_tensors[f"{TIED_HEAD}.weight"] = emb
    ex.saved_modules = sorted(mods)


def tied_embedding(model: ModelFolder) -> str | None:
    """The token embedding a causal LM's head is tied to (``tie_word_embeddings``, no head stored), else None.

    PEFT's ``modules_to_save`` copies a module, which unties it: a saved embedding needs a saved head too.
    """
    cfg = model.config
    if not cfg.get("tie_word_embeddings", True) or f"{TIED_HEAD}.weight" in model.tensors:
        return None
    if not any(str(a).endswith(("ForCausalLM", "LMHeadModel")) for a in cfg.get("architectures") or []):
        return None
    vocab = cfg.get("vocab_size")
    hits = [p.weight for p in parts(model.tensors, model.model_type).values()
            if p.kind == "embedding" and p.weight_shape[0] == vocab and "position" not in p.name and
            not p.name.endswith("wpe")]
    return hits[0] if len(hits) == 1 else None


def _prefixes(name: str) -> list[str]:
    bits = name.split(".")
    return [".".join(bits[:i]) for i in range(1, len(bits))]


def open_extraction(base_path, tuned_path, *, rank: str, targets=(ALL_LINEAR,), others: str | None = None,
                    seed: int = 0) -> Extraction:
    """Open both models, pick the targets, and list what else differs (reads the non-target tensors once).

    Args:
        base_path, tuned_path (str | Path): model folders. rank (str): N | energy:E | auto.
        targets (Iterable[str]): module names (PEFT's suffix rule) or ``all-linear``.
        others (str | None): save | drop | None (refuse when anything differs). seed (int): sketch seed.
    """
    policy = RankPolicy.parse_extract(rank)
    if others not in (None, *OTHERS):
        raise UsageError(f"--others {others!r}: use save or drop")
    base = ModelFolder(base_path, "--base-model")
    try:
        tuned = ModelFolder(tuned_path, "--tuned")
    except BaseException:
        base.close()
        raise
    try:
        return _scan(base, tuned, policy, targets, others, seed)
    except BaseException:
        base.close()
        tuned.close()
        raise


def _scan(base: ModelFolder, tuned: ModelFolder, policy: RankPolicy, targets, others, seed: int) -> Extraction:
    if base.model_type != tuned.model_type:
        raise ModelError(f"--tuned {tuned.path}: model_type {tuned.model_type!r} differs from the base's "
                         f"{base.model_type!r}; extract from a fine-tune of --base-model")
    bparts, tparts = parts(base.tensors, base.model_type), parts(tuned.tensors, tuned.model_type)
    picked = select(bparts, [t.strip() for t in targets if t.strip()])
    chosen = {m: bparts[m] for m in picked if m in tparts and tparts[m].weight_shape == bparts[m].weight_shape}
    emb = tied_embedding(tuned)
    if emb is not None and module_of(emb) in chosen:
        raise UsageError(f"--targets: {module_of(emb)} is tied to the output head, and a LoRA on the embedding does "
                         "not move the head; leave it out of --targets (--others save keeps it, and the head, whole)")
    if not chosen:
        raise UsageError(f"--targets: {few(picked)} exist in the base but not with the same shape in the fine-tune; "
                         "nothing to extract (--others lists what differs)")
    layouts = {p.kind for p in chosen.values()} - {"embedding"}
    if len(layouts) > 1:
        conv = few([m for m, p in chosen.items() if p.kind == "conv1d"], 3)
        raise UsageError(f"--targets: picks both Conv1D ({conv}) and Linear modules, and PEFT has one fan_in_fan_out "
                         "per adapter; extract them separately with narrower --targets")
    ex = Extraction(base, tuned, chosen, policy, find_others(base, tuned, {p.weight for p in chosen.values()}),
                    others, seed)
    if ex.others and others is None:
        raise UsageError(others_message(ex.others) + "; pass --others save to keep their modules whole "
                         "(modules_to_save) or --others drop to leave them out")
    plan_saved(ex)
    return ex


def cut_all(ex: Extraction, sink, progress=None) -> None:
    """Cut every target in the fine-tune's file order (so both files hash as they are read).

    Args:
        ex (Extraction). sink (callable): ``sink(module, Part, ModuleCut)`` stores the factors.
        progress (callable | None): wraps an iterable (tqdm).
    """
    order = [n for n in ex.tuned.in_file_order()]
    weights = {p.weight: p for p in ex.targets.values()}
    it = progress(order) if progress else order
    for name in it:
        if name not in weights:  # read only to hash the files on the way
            for model in (ex.tuned, ex.base):
                if name in model.tensors:
                    for _ in model.read_chunks(name):
                        pass
            continue
        part = weights[name]
        t0 = time.perf_counter()
        b, t = ex.base.read(name), ex.tuned.read(name)
        D = lora_difference(b, t, part)
        if not bool(torch.isfinite(D).all()):
            _refuse_non_finite(name, (ex.base, b), (ex.tuned, t))
        del b, t
        total = float(torch.linalg.vector_norm(D) ** 2)
        c = cut_module(D, ex.policy, ex.seed, total)
        del D
        s = c.svd
        rec = {"kind": part.kind, "shape": list(part.shape), "rank": c.rank, "method": s.method,
               "power_iters": c.power_iters, "total_energy": s.total_energy, "dropped_energy": s.dropped_energy,
               "kept_share": s.captured_share, "rel_error": s.relative_error, "seconds": time.perf_counter() - t0}
        if ex.policy.kind == "energy":
            rec.update(rank_lower_bound=c.rank_lower_bound, minimal=c.minimal)
        if ex.policy.kind == "auto":
            rec.update(sigma=c.sigma, threshold=c.threshold)
        ex.modules[part.name] = rec
        sink(part.name, part, c)
    for name in ex.base.in_file_order():
        if name not in ex.tuned.tensors:
            for _ in ex.base.read_chunks(name):
                pass


def _refuse_non_finite(name: str, *sides) -> None:
    """A ModelError naming the tensor and the model(s) holding its NaN/Inf values (a float64 difference of two
    finite tensors is finite, so one of them is not)."""
    counts = [(m, int((~torch.isfinite(t)).sum())) for m, t in sides]
    held = [f"{m.flag} {m.path} ({n} NaN/Inf value(s))" for m, n in counts if n]
    raise ModelError(f"tensor {name} holds NaN/Inf values in {' and '.join(held) or 'neither model (overflow)'}; "
                     "extract needs finite weights: check or re-save that model")

