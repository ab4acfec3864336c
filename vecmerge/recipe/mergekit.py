"""mergekit merge configurations read as vecmerge recipes: ``vecmerge merge --config FILE.yml``.

A mergekit YAML (mergekit 0.1.5's ``MergeConfiguration``) names a ``merge_method``, a ``base_model``, the
``models`` (each with ``parameters``: ``weight``, ``density``, ...), global ``parameters`` and a ``dtype``;
here the models are LoRA adapters (workspace names, or folders relative to the YAML), and the merge runs on
their updates with the base model at the origin (mergekit's ``base + merge(deltas)`` is the update
``merge(deltas)``), written as a LoRA. What maps:

- ``merge_method``: every mergekit method vecmerge has (``task_arithmetic``, ``ties``, ``dare_ties``,
  ``dare_linear``, ``breadcrumbs``, ``breadcrumbs_ties``, ``della``, ``della_linear``, ``sce``,
  ``model_stock``, ``nuslerp``, ``multislerp``, ``karcher``, ``slerp``), ``linear`` as ``task_arithmetic``
  with mergekit's ``normalize: true``, and vecmerge's own merge methods by name;
- per-model ``weight`` and ``density`` stay per model; other per-model parameters (``gamma``, ``epsilon``)
  must agree across models (vecmerge takes one); global ``parameters`` are the method's options (a
  global ``weight`` or ``density`` is every model's default), ``int8_mask`` is accepted and has no effect;
- ``base_model``: a model listed in ``models`` too is dropped from them (its update is the origin, as
  mergekit skips it); a hub id is recorded as the output's ``base_model_id``, a local model folder is the
  recipe's ``base_model`` (DoRA inputs are read against it); a model written ``BASE+LORA`` (mergekit's LoRA
  syntax) is the LoRA;
- ``dtype`` (or ``out_dtype``): the written dtype (float32, bfloat16, float16; vecmerge computes in float64);
- ``slices`` whose sources all take the same models over one ``layer_range`` each select those layers
  (``only``); the LoRA keeps each layer where it is (mergekit's output would stack the slices into a new
  model), so overlapping slices, slices of different models and per-slice parameters are refused.

Mergekit defaults fill what the file leaves out (``density: 1`` for the sparsifying methods). Every key
vecmerge does not support is named in one problem line. This module imports no torch.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

from .. import methods
from ..errors import RecipeError
from ..expr import NAME_RE

METHODS = {"linear": "task_arithmetic", "task_arithmetic": "task_arithmetic", "ties": "ties",
           "dare_ties": "dare_ties", "dare_linear": "dare_linear", "breadcrumbs": "breadcrumbs",
           "breadcrumbs_ties": "breadcrumbs_ties", "della": "della", "della_linear": "della_linear", "sce": "sce",
           "model_stock": "model_stock", "nuslerp": "nuslerp", "multislerp": "multislerp", "karcher": "karcher",
           "slerp": "slerp"}
MERGEKIT_ONLY = ("passthrough", "nearswap", "arcee_fusion", "ram", "ramplus_tl")
TOP_KEYS = ("merge_method", "base_model", "models", "slices", "parameters", "dtype", "out_dtype")
UNSUPPORTED_TOP = ("modules", "tokenizer_source", "tokenizer", "chat_template")
PER_MODEL = ("weight", "density")
SPARSIFYING = ("ties", "dare_ties", "dare_linear", "breadcrumbs", "breadcrumbs_ties", "della", "della_linear")
IGNORED = ("int8_mask",)  # mergekit's memory option: no effect on the result
DTYPES = {"float32": "fp32", "fp32": "fp32", "bfloat16": "bf16", "bf16": "bf16", "float16": "fp16",
          "fp16": "fp16"}
HUB_RE = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


def _scalar(value, where: str, problems: list):
    """A plain parameter value; mergekit's gradients (lists) and filters (mappings) are refused."""
    if isinstance(value, (list, dict)):
        kind = "a gradient (a list of values over the layers)" if isinstance(value, list) else "a filtered value"
        problems.append(f"{where}: {kind} is not supported; give one value")
        return None
    return value


def _model_ref(raw, where: str, root: Path, known, problems: list, inputs: dict) -> str | None:
    """The recipe name of one model reference: a workspace name, or a folder pinned in ``inputs``."""
    ref = str(raw)
    if "+" in ref:  # mergekit's BASE+LORA: the LoRA is what is merged
        ref = ref.split("+", 1)[1]
    if re.fullmatch(NAME_RE, ref) and (ref in known or (root / ref).is_dir() or Path(ref).is_dir()):
        return ref
    folder = (root / ref) if not Path(ref).is_absolute() else Path(ref)
    if folder.is_dir():
        stem = re.sub(r"[^A-Za-z0-9_]", "_", folder.resolve().name) or "model"
        name = stem if re.match(r"[A-Za-z_]", stem) else f"m_{stem}"
        while name in inputs and inputs[name]["path"] != str(folder.resolve()):
            name += "_"
        inputs[name] = {"path": str(folder.resolve())}
        return name
    hint = " (a hub id: download the adapter and name its folder)" if HUB_RE.fullmatch(ref) else ""
    problems.append(f"{where}: {ref!r} is neither a workspace adapter nor a LoRA folder{hint}")
    return None


def _slices(raw, problems: list) -> tuple[list, str | None]:
    """``(sources, only)`` of slices that select layers; problems for any other use of slices."""
    if not isinstance(raw, list) or not raw:
        problems.append("slices: a list of {sources: [{model, layer_range: [start, end]}]}")
        return [], None
    models, layers = None, []
    for i, sl in enumerate(raw):
        srcs = sl.get("sources") if isinstance(sl, dict) else None
        extra = sorted(set(sl) - {"sources"}) if isinstance(sl, dict) else []
        if extra:
            problems.append(f"slices[{i}]: {', '.join(extra)} not supported (per-slice settings)")
        if not isinstance(srcs, list) or not srcs:
            problems.append(f"slices[{i}].sources: a list of {{model, layer_range}}")
            continue
        ranges = {tuple(s.get("layer_range") or ()) for s in srcs if isinstance(s, dict)}
        if len(ranges) != 1 or len(next(iter(ranges))) != 2:
            problems.append(f"slices[{i}]: every source takes one layer_range [start, end] (they differ, or one is "
                            "missing): a LoRA cannot move layers")
            continue
        a, b = next(iter(ranges))
        names = [s.get("model") for s in srcs]
        entries = [{k: v for k, v in s.items() if k != "layer_range"} for s in srcs]
        if models is None:
            models = entries
        elif [e.get("model") for e in models] != names or entries != models:
            problems.append(f"slices[{i}]: other models or parameters than slices[0]; vecmerge merges one set of "
                            "models over the selected layers")
        if not (isinstance(a, int) and isinstance(b, int) and 0 <= a < b):
            problems.append(f"slices[{i}].layer_range: [start, end] with 0 <= start < end")
            continue
        if any(a < hi and lo < b for lo, hi in layers):
            problems.append(f"slices[{i}]: layers {a}-{b - 1} overlap another slice (a LoRA cannot repeat a layer)")
        layers.append((a, b))
    picked = sorted({n for a, b in layers for n in range(a, b)})
    only = r"(^|\.)layers\.(" + "|".join(map(str, picked)) + r")\." if picked else None
    return models or [], only


def from_mergekit(data, source: str, root: Path, known=()) -> tuple[dict, dict]:
    """A vecmerge recipe (keys of ``Recipe.from_dict``) from a mergekit configuration; RecipeError listing every
    problem at once.

    Args:
        data (dict): the parsed YAML. source (str): its file, for messages. root (Path): where relative model
            folders start (the YAML's folder). known (Iterable[str]): the workspace's adapter names.

    Returns:
        (recipe dict, notes) with ``notes``: ``{"mergekit_method", "base_model", "ignored"}`` for the report.
    """
    if not isinstance(data, dict):
        raise RecipeError(["a mergekit configuration: a mapping with merge_method and models"], source)
    p: list[str] = []
    unsupported = [k for k in data if k in UNSUPPORTED_TOP or k not in TOP_KEYS]
    if unsupported:
        p.append(f"not supported for LoRA merges: {', '.join(map(str, unsupported))} (vecmerge reads merge_method, "
                 f"base_model, models, parameters, dtype, slices that select layers)")
    mk = str(data.get("merge_method") or "")
    method = METHODS.get(mk) or (mk if mk in methods.merge_names() else None)
    if not mk:
        p.append("merge_method: missing (e.g. ties)")
    elif method is None:
        why = "it has no LoRA-to-LoRA form" if mk in MERGEKIT_ONLY else "unknown to vecmerge"
        p.append(f"merge_method={mk!r}: {why}; use one of {', '.join(sorted(METHODS))} (or a vecmerge method: "
                 f"{', '.join(n for n in methods.merge_names() if n not in METHODS.values())})")
    if data.get("models") is not None and data.get("slices") is not None:
        p.append("models and slices: give one of them")
    only = None
    raw_models = data.get("models")
    if data.get("slices") is not None:
        raw_models, only = _slices(data["slices"], p)
    if not isinstance(raw_models, list) or not raw_models:
        p.append("models: a list of {model: NAME-or-FOLDER, parameters: {weight, density}}")
        raw_models = []
    inputs: dict = {}
    base = data.get("base_model")
    base_ref = None if base is None else str(base)
    params = {}
    for k, v in (data.get("parameters") or {}).items():
        v = _scalar(v, f"parameters.{k}", p)
        if v is not None and k not in IGNORED:
            params[str(k)] = v
    entries, per_model = [], {}
    for i, e in enumerate(raw_models):
        if isinstance(e, str):
            e = {"model": e}
        if not isinstance(e, dict) or e.get("model") is None:
            p.append(f"models[{i}]: a mapping with model and parameters")
            continue
        bad = sorted(set(e) - {"model", "parameters"})
        if bad:
            p.append(f"models[{i}]: {', '.join(bad)} not supported")
        if base_ref is not None and str(e["model"]) == base_ref:
            continue  # the base model's own update is zero: mergekit skips it
        name = _model_ref(e["model"], f"models[{i}].model", root, known, p, inputs)
        entry = {"model": name}
        for k, v in (e.get("parameters") or {}).items():
            v = _scalar(v, f"models[{i}].parameters.{k}", p)
            if v is None:
                continue
            if k in PER_MODEL:
                entry[k] = v
            else:
                per_model.setdefault(str(k), []).append(v)
        if name is not None:
            entries.append(entry)
    for k, vals in per_model.items():
        if len(set(map(repr, vals))) > 1:
            p.append(f"models[*].parameters.{k}: differs between models ({', '.join(map(repr, vals))}); vecmerge takes "
                     f"one {k} for all (put it under parameters)")
        elif len(vals) != len(entries):
            p.append(f"models[*].parameters.{k}: given for some models only; put it under parameters")
        elif k not in params:
            params[k] = vals[0]
    for key in ("weight", "density"):  # a global weight or density is every model's default
        if key in params:
            v = params.pop(key)
            for entry in entries:
                entry.setdefault(key, v)
    if method in SPARSIFYING:
        for entry in entries:
            entry.setdefault("density", 1.0)  # mergekit's default
    if mk == "linear":
        params.setdefault("normalize", True)  # mergekit's linear divides by the sum of the weights
    if mk == "slerp" and method == "slerp" and base_ref is not None:
        names = [str(e.get("model")) for e in raw_models if isinstance(e, dict)]
        if base_ref in names:  # mergekit's slerp interpolates from base_model (t = 0) to the other model
            first = _model_ref(base_ref, "base_model", root, known, p, inputs)
            entries = [{"model": first}] + [e for e in entries if e["model"] != first]
    rec = {"method": method, "models": entries, **params}
    if only is not None:
        rec["only"] = only
    if inputs:
        rec["inputs"] = inputs
    dt = data.get("out_dtype") or data.get("dtype")
    if dt is not None:
        if str(dt) not in DTYPES:
            p.append(f"dtype={dt!r}: one of float32, bfloat16, float16")
        else:
            rec["dtype"] = DTYPES[str(dt)]
    if base_ref is not None and HUB_RE.fullmatch(base_ref) and not (root / base_ref).exists():
        rec["base_model_id"] = base_ref
    elif base_ref is not None and (root / base_ref / "config.json").is_file():
        rec["base_model"] = str((root / base_ref).resolve())  # a local model: DoRA inputs read against it
    if p:
        raise RecipeError(p, source)
    weights = [e.get("weight") for e in entries]
    if mk == "linear" and params.get("normalize") is False and not math.isclose(sum(w or 1.0 for w in weights), 1.0):
        raise RecipeError(["merge_method=linear with normalize: false scales the base model itself by the sum of the "
                           "weights, which a LoRA cannot; use task_arithmetic"], source)
    return rec, {"mergekit_method": mk, "base_model": base_ref}
