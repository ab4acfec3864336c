"""mergekit merge configurations read as vecmerge recipes: ``vecmerge merge --config FILE.yml``.

A mergekit YAML (mergekit 0.1.5's ``MergeConfiguration``: ``merge_method``, ``base_model``, ``models`` with
their ``parameters``, global ``parameters``, ``dtype``, ``slices``) becomes one ``Recipe``: the models are
LoRA adapters and the merge runs on their updates with the base model at the origin (mergekit's
``base + merge(deltas)`` is the update ``merge(deltas)``), written as a LoRA. mergekit's defaults fill what
the file leaves out (``mergekit_vocab.DEFAULTS``); every key vecmerge does not support is named in one
problem line. No torch here. What maps to what: docs/design/recipe.md.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any, TypedDict

from .. import methods
from ..errors import RecipeError
from ..expr import NAME_RE
from . import mergekit_values as mv
from . import mergekit_vocab as vocab
from .mergekit_values import Conditions, Row, Scalar
from .mergekit_vocab import did_you_mean, meaning_notes

METHODS = {"linear": "task_arithmetic", "task_arithmetic": "task_arithmetic", "ties": "ties",
           "dare_ties": "dare_ties", "dare_linear": "dare_linear", "breadcrumbs": "breadcrumbs",
           "breadcrumbs_ties": "breadcrumbs_ties", "della": "della", "della_linear": "della_linear", "sce": "sce",
           "model_stock": "model_stock", "nuslerp": "nuslerp", "multislerp": "multislerp", "karcher": "karcher",
           "slerp": "slerp"}
MERGEKIT_ONLY = ("passthrough", "nearswap", "arcee_fusion", "ram", "ramplus_tl")
READ = ("merge_method", "base_model", "models", "slices", "parameters", "dtype", "out_dtype", "rank")
IGNORED_TOP = ("tokenizer_source", "tokenizer", "chat_template")  # a LoRA has no tokenizer: noted, not used
PER_MODEL = ("weight", "density")
SPARSIFYING = ("ties", "dare_ties", "dare_linear", "breadcrumbs", "breadcrumbs_ties", "della", "della_linear")
IGNORED = ("int8_mask",)  # mergekit's memory option: no effect on the result
DTYPES = {"float32": "fp32", "fp32": "fp32", "bfloat16": "bf16", "bf16": "bf16", "float16": "fp16",
          "fp16": "fp16"}
HUB_RE = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


def _model_ref(raw: object, where: str, root: Path, known: Collection[str], problems: list[str],
               inputs: dict[str, dict[str, str]]) -> str | None:
    """The recipe name of one model reference: a workspace name, or a folder pinned in ``inputs``."""
    if not isinstance(raw, str) or not raw:
        problems.append(f"{where}={mv.shown(raw)}: a workspace adapter name or a LoRA folder")
        return None
    ref = raw.split("+", 1)[1] if "+" in raw else raw  # mergekit's BASE+LORA: the LoRA is what is merged
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


def _params(raw: object, where: str, problems: list[str], allowed: Collection[str]) -> dict[str, Conditions]:
    """``{name: conditions}`` of a ``parameters`` mapping (``mergekit_values.setting``), names checked."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        problems.append(f"{where}={mv.shown(raw)}: a mapping of mergekit parameters, e.g. {{weight: 0.5, density: "
                        "0.3}")
        return {}
    out: dict[str, Conditions] = {}
    for k, v in raw.items():
        if str(k) not in allowed:
            problems.append(f"{where}.{k}: not a mergekit parameter{did_you_mean(k, vocab.PARAMETERS)}")
            continue
        conds = mv.setting(v, f"{where}.{k}", problems)
        if conds is not None:
            out[str(k)] = conds
    return out


def _slices(raw: object, problems: list[str]) -> tuple[list[dict], list[tuple[int, int]]]:
    """``(sources, [(start, end)])`` of slices that select layers; problems for any other use of slices."""
    if not isinstance(raw, list) or not raw:
        problems.append("slices: a list of {sources: [{model, layer_range: [start, end]}]}")
        return [], []
    models: list[dict] | None = None
    layers: list[tuple[int, int]] = []
    for i, sl in enumerate(raw):
        if not isinstance(sl, dict):
            problems.append(f"slices[{i}]={mv.shown(sl)}: a mapping {{sources: [{{model, layer_range}}]}}")
            continue
        for k in sorted(set(map(str, sl)) - {"sources"}):
            why = "per-slice settings are not supported" if k in vocab.SLICE_KEYS else \
                f"not a mergekit slice key{did_you_mean(k, vocab.SLICE_KEYS)}"
            problems.append(f"slices[{i}].{k}: {why}")
        srcs = sl.get("sources")
        if not isinstance(srcs, list) or not srcs or not all(isinstance(s, dict) for s in srcs):
            problems.append(f"slices[{i}].sources: a list of mappings {{model, layer_range: [start, end]}}")
            continue
        for j, s in enumerate(srcs):
            for k in sorted(set(map(str, s)) - set(vocab.SOURCE_KEYS)):
                problems.append(f"slices[{i}].sources[{j}].{k}: not a mergekit source key"
                                f"{did_you_mean(k, vocab.SOURCE_KEYS)}")
        ranges = [mv.layer_range(s.get("layer_range"), f"slices[{i}].sources[{j}].layer_range", problems)
                  for j, s in enumerate(srcs)]
        picked = [r for r in ranges if r is not None]
        if len(picked) != len(ranges):
            continue
        if len(set(picked)) != 1:
            problems.append(f"slices[{i}]: every source takes the same layer_range (they differ): a LoRA cannot "
                            "move layers")
            continue
        a, b = picked[0]
        entries = [{k: v for k, v in s.items() if k != "layer_range"} for s in srcs]
        if models is None:
            models = entries
        elif entries != models:
            problems.append(f"slices[{i}]: other models or parameters than slices[0]; vecmerge merges one set of "
                            "models over the selected layers")
        if any(a < hi and lo < b for lo, hi in layers):
            problems.append(f"slices[{i}]: layers {a}-{b - 1} overlap another slice (a LoRA cannot repeat a layer)")
        layers.append((a, b))
    return models or [], layers


def _only(layers: list[tuple[int, int]]) -> str | None:
    """The ``only`` pattern of the selected layer ranges (each range, not each layer: bounded size)."""
    if not layers:
        return None
    picked = sorted({n for a, b in layers for n in range(a, b)})
    return r"(^|\.)layers\.(" + "|".join(map(str, picked)) + r")\."


def _method(data: dict, p: list[str]) -> tuple[str, str | None]:
    """``(mergekit's merge_method, vecmerge's method or None)``; a problem when there is none."""
    mk = data.get("merge_method")
    mk = "" if mk is None else str(mk)
    method = METHODS.get(mk) or (mk if mk in methods.merge_names() else None)
    if not mk:
        p.append("merge_method: missing (e.g. ties)")
    elif method is None:
        why = "it has no LoRA-to-LoRA form" if mk in MERGEKIT_ONLY else \
            f"not a mergekit merge_method{did_you_mean(mk, vocab.METHOD_NAMES)}"
        p.append(f"merge_method={mv.shown(mk)}: {why}; use one of {', '.join(sorted(METHODS))} (or a vecmerge "
                 f"method: {', '.join(n for n in methods.merge_names() if n not in METHODS.values())})")
    return mk, method


def _resolve(conds: Conditions, where: str, layers: list[tuple[int, int]] | None, p: list[str]
             ) -> tuple[Scalar, list[Row] | None]:
    """``(value, rows)``: a constant setting's value (rows None), or the fallback value and ``per_module`` rows."""
    value = mv.constant(conds)
    if value is not None:
        return value, None
    plain = [v for f, v in conds if f is None]
    fallback = (plain or [conds[0][1]])[0][0]
    if any(len(v) > 1 for _, v in conds) and not layers:
        p.append(f"{where}: a gradient is interpolated over the layers, and none were found in the adapters; give "
                 "one value, or slices with a layer_range")
        return fallback, None
    return fallback, mv.per_layer(conds, layers or [])


class Translated(TypedDict):
    """What the translation of a mergekit file says beside the recipe (``from_mergekit``'s notes)."""

    mergekit_method: str
    base_model: str | None
    defaults: dict[str, Scalar]  # the values mergekit's defaults filled
    notes: list[str]  # one line per meaning that differs or key ignored


def from_mergekit(data: object, source: str, root: Path, known: Collection[str] = (),
                  layers: Callable[[str, dict], int | None] | None = None) -> tuple[dict, Translated]:
    """A vecmerge recipe (keys of ``Recipe.from_dict``) from a mergekit configuration; RecipeError listing every
    problem at once.

    Args:
        data (dict): the parsed YAML. source (str): its file, for messages. root (Path): where relative model
            folders start (the YAML's folder). known (Iterable[str]): the workspace's adapter names.
        layers (Callable[[str, dict], int | None] | None): the number of layers of a model (its recipe name and
            the recipe's ``inputs``), for gradients over ``models`` and to bound ``layer_range``.

    Returns:
        (recipe dict, notes) with ``notes`` (Translated): ``{"mergekit_method", "base_model", "defaults", "notes"}``:
        the values mergekit's defaults filled, and one line per meaning that differs or key ignored.
    """
    if not isinstance(data, dict):
        raise RecipeError(["a mapping with merge_method and models (a mergekit configuration)"], source)
    p: list[str] = []
    said: list[str] = []
    for k in data:
        if k == "modules":
            p.append("modules: mergekit's per-module configurations are not supported for LoRA merges; use models "
                     "or slices")
        elif k in IGNORED_TOP:
            said.append(f"{k}: ignored (a LoRA carries no tokenizer or chat template; use the base model's)")
        elif k not in READ:
            p.append(f"{k}: not a mergekit key{did_you_mean(k, vocab.TOP_KEYS)} (vecmerge reads merge_method, "
                     "base_model, models, parameters, dtype, slices that select layers, and rank)")
    mk, method = _method(data, p)
    fields = {f.name for f in methods.get(method).fields} if method else set()
    allowed = set(vocab.PARAMETERS) | fields
    if data.get("models") is not None and data.get("slices") is not None:
        p.append("models and slices: give one of them")
    raw_models: object = data.get("models")
    ranges: list[tuple[int, int]] = []
    if data.get("slices") is not None:
        raw_models, ranges = _slices(data["slices"], p)
    if not isinstance(raw_models, list) or not raw_models:
        if data.get("slices") is None:
            p.append("models: a list of {model: NAME-or-FOLDER, parameters: {weight, density}}")
        raw_models = []
    inputs: dict[str, dict[str, str]] = {}
    base = data.get("base_model")
    base_ref = None if base is None else str(base)
    params = _params(data.get("parameters"), "parameters", p, allowed)
    entries: list[tuple[str, dict[str, Conditions]]] = []  # (recipe name, its weight and density settings)
    per_model: dict[str, list[Scalar | None]] = {}
    base_weight: Conditions | None = None
    lora_base = _lora_base(mk, base_ref, raw_models, root, known, p)
    for i, e in enumerate(raw_models):
        e = {"model": e} if isinstance(e, str) else e
        if not isinstance(e, dict) or e.get("model") is None:
            p.append(f"models[{i}]: a mapping with model and parameters")
            continue
        for k in sorted(set(map(str, e)) - set(vocab.MODEL_KEYS) - {"layer_range"}):
            p.append(f"models[{i}].{k}: not a mergekit model key{did_you_mean(k, vocab.MODEL_KEYS)}")
        own = _params(e.get("parameters"), f"models[{i}].parameters", p, allowed)
        if base_ref is not None and str(e["model"]) == base_ref and not lora_base:  # update zero: mergekit skips
            base_weight = own.get("weight", params.get("weight"))  # ... the base, except linear, which averages it
            continue
        name = _model_ref(e["model"], f"models[{i}].model", root, known, p, inputs)
        for k, conds in own.items():
            if k not in PER_MODEL:
                per_model.setdefault(k, []).append(mv.constant(conds))
        if name is not None:
            entries.append((name, {k: own[k] for k in own if k in PER_MODEL}))
    if lora_base and mk in ("karcher", "slerp") and base_ref not in _listed(raw_models):
        name = _model_ref(base_ref, "base_model", root, known, p, inputs)  # mergekit adds the base as an input
        if name is not None:
            entries.append((name, {}))
    settings = [*params.values(), *(s for _, own in entries for s in own.values())]
    varying = any(mv.constant(c) is None for c in settings)
    n = layers(entries[0][0], inputs) if layers is not None and entries and (varying or ranges) else None
    layers_of = ranges or ([(0, n)] if n else [])
    beyond = [f"[{a}, {b}]" for a, b in ranges if b > n] if n else []
    if beyond and n:
        p.append(f"slices: layer_range {', '.join(beyond)} beyond the model's {n} layers (the adapters hold layers "
                 f"0-{n - 1}); end at {n} or below")
    rec_params: dict[str, Scalar] = {}
    per_module: dict[str, list[Row]] = {}
    for k, conds in params.items():
        v, rows = _resolve(conds, f"parameters.{k}", layers_of, p)
        if k in IGNORED:
            continue
        rec_params[k] = v
        if rows:
            per_module[k] = rows
    for k, vals in per_model.items():
        if None in vals:
            p.append(f"models[*].parameters.{k}: a gradient or filter of {k} per model is not supported; put one "
                     f"value under parameters")
        elif len(set(map(repr, vals))) > 1:
            p.append(f"models[*].parameters.{k}: differs between models ({', '.join(map(repr, vals))}); vecmerge "
                     f"takes one {k} for all (put it under parameters)")
        elif len(vals) != len(entries):
            p.append(f"models[*].parameters.{k}: given for some models only; put it under parameters")
        elif k not in rec_params and k not in IGNORED:
            rec_params[k] = vals[0]
    out_entries: list[dict[str, Scalar]] = []
    for i, (name, own) in enumerate(entries):
        item: dict[str, Scalar] = {"model": name}
        for key in PER_MODEL:  # a global weight or density is every model's default
            given = own.get(key)
            if given is None and key in params:
                item[key] = rec_params.get(key)
                if key in per_module:
                    per_module[f"models.{i}.{key}"] = per_module[key]
                continue
            if given is not None:
                v, rows = _resolve(given, f"models[{i}].parameters.{key}", layers_of, p)
                item[key] = v
                if rows:
                    per_module[f"models.{i}.{key}"] = rows
        out_entries.append(item)
    for key in PER_MODEL:
        rec_params.pop(key, None)
        per_module.pop(key, None)
    defaults: dict[str, Scalar] = {}
    if method in SPARSIFYING:
        for item in out_entries:
            item.setdefault("density", 1.0)  # mergekit's default
    for k, v in vocab.DEFAULTS.get(mk, {}).items():
        if k not in rec_params:
            rec_params[k] = defaults[k] = v
    if mk == "slerp" and method == "slerp" and base_ref is not None:
        if base_ref in _listed(raw_models) or lora_base:  # mergekit's slerp: from base_model (t = 0) to the other
            first = _model_ref(base_ref, "base_model", root, known, p, inputs)
            out_entries = [{"model": first}] + [e for e in out_entries if e["model"] != first]
    rec: dict[str, Any] = {"method": method, "models": out_entries, **rec_params}
    if per_module:
        rec["per_module"] = {k: [list(r) for r in rows] for k, rows in per_module.items()}
    only = _only(ranges)
    if only is not None:
        rec["only"] = only
    if inputs:
        rec["inputs"] = inputs
    if data.get("rank") is not None:
        rec["rank"] = data["rank"]  # vecmerge's own key (mergekit writes full weights): the written rank
    dt = data.get("out_dtype") or data.get("dtype")
    if dt is not None:
        if str(dt) not in DTYPES:
            p.append(f"dtype={mv.shown(dt)}: one of float32, bfloat16, float16")
        else:
            rec["dtype"] = DTYPES[str(dt)]
    if base_ref is not None and HUB_RE.fullmatch(base_ref) and not (root / base_ref).exists():
        rec["base_model_id"] = base_ref
    elif base_ref is not None and (root / base_ref / "config.json").is_file():
        rec["base_model"] = str((root / base_ref).resolve())  # a local model: DoRA inputs read against it
    weights = [item.get("weight") for item in out_entries]
    if mk == "linear" and not p:
        _linear(rec, weights, base_weight, p)
    if p:
        raise RecipeError(p, source)
    said += meaning_notes(mk, base_ref is not None, weights)
    if per_module:
        said.append(f"gradients or filters of {', '.join(sorted(per_module))}: resolved per module as mergekit "
                    f"does (the recipe's per_module rows, {sum(map(len, per_module.values()))} in all)")
    return rec, {"mergekit_method": mk, "base_model": base_ref, "defaults": defaults, "notes": said}


def _listed(raw_models: list[object]) -> list[str]:
    """The model references of ``models`` (strings or ``{model: ...}`` mappings) as the file writes them."""
    return [str(e.get("model") if isinstance(e, dict) else e) for e in raw_models]


def _lora_base(mk: str, base_ref: str | None, raw_models: list[object], root: Path, known: Collection[str],
               p: list[str]) -> bool:
    """Whether ``base_model`` is a LoRA adapter (a workspace name, a folder with ``adapter_config.json``, or
    mergekit's ``BASE+LORA``): its update is not the origin, so it is kept as a model where mergekit takes the base
    as one more input (``slerp``, ``linear``, ``karcher``); a problem line for any other method, whose mergekit
    result ``W_base + merge(W_i - W_base)`` merges the differences from it."""
    if base_ref is None:
        return False
    folder = Path(base_ref) if Path(base_ref).is_absolute() else root / base_ref
    if not ("+" in base_ref or base_ref in known or (folder / "adapter_config.json").is_file()):
        return False
    if mk == "linear" and base_ref not in _listed(raw_models):
        p.append(f"base_model={base_ref!r}: a LoRA adapter, which mergekit's linear averages as one more model and "
                 f"needs its weight: list it under models with a weight, or name the backbone as base_model")
    elif mk not in ("slerp", "linear", "karcher"):
        p.append(f"base_model={base_ref!r}: a LoRA adapter, and mergekit's {mk or 'merge'} would merge the other "
                 "models' differences from it (W_base + merge(W_i - W_base)), which vecmerge does not compute; name "
                 f"the backbone (a hub id or a model folder) as base_model and list {base_ref!r} under models")
    return True


def _linear(rec: dict, weights: list[float | None], base_weight: Conditions | None, p: list[str]) -> None:
    """mergekit's ``linear``: ``sum_i w_i W_i / sum_i w_i``, on updates ``sum_i w_i x_i / sum_i w_i`` (the base's
    own weight, when it is listed, in the sum); refused where a LoRA cannot hold it."""
    ws = [1.0 if w is None else w for w in weights]
    total = sum(ws) + (0.0 if base_weight is None else (mv.constant(base_weight) or 0.0))
    if rec.get("normalize"):
        if abs(total) < 1e-8:
            p.append(f"parameters.normalize: merge_method linear divides by the sum of the weights, which is "
                     f"{total:g} here (mergekit then silently skips the division, and its output loses the base "
                     "model); use merge_method task_arithmetic for the weighted sum of the updates (weights 1, -1: "
                     "their difference)")
        elif base_weight is not None:
            rec["normalize"] = False
            for item in rec["models"]:
                item["weight"] = item.get("weight", 1.0) / total
    elif not math.isclose(total, 1.0):
        p.append("parameters.normalize: merge_method linear with normalize: false scales the base model itself by "
                 "the sum of the weights, which a LoRA cannot; use task_arithmetic")
