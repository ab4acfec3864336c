"""mergekit 0.1.5's vocabulary and defaults, and where its methods mean something else on LoRA updates.

A typo in a mergekit file is answered in mergekit's words (``did_you_mean`` over ``TOP_KEYS``,
``METHOD_NAMES``, ``PARAMETERS``), never vecmerge's recipe keys. ``DEFAULTS`` are the values mergekit
gives what a file leaves out (``merge_methods/registry.py``: ``default_normalize``, ``default_rescale``),
which vecmerge's flags leave unset (PEFT's rule); ``meaning_notes`` says, for a translated configuration,
where vecmerge's result is not the one mergekit would compute (docs/METHODS.md, "mergekit configurations").
This module imports no torch.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

TOP_KEYS = ("merge_method", "base_model", "models", "slices", "parameters", "dtype", "out_dtype",
            "tokenizer_source", "tokenizer", "chat_template", "modules")
METHOD_NAMES = ("linear", "task_arithmetic", "ties", "dare_ties", "dare_linear", "breadcrumbs", "breadcrumbs_ties",
                "della", "della_linear", "sce", "model_stock", "nuslerp", "multislerp", "karcher", "slerp",
                "passthrough", "nearswap", "arcee_fusion", "ram", "ramplus_tl")
PARAMETERS = ("weight", "density", "gamma", "epsilon", "int8_mask", "normalize", "rescale", "lambda", "t",
              "nuslerp_flatten", "nuslerp_row_wise", "normalize_weights", "eps", "max_iter", "tol", "filter_wise",
              "select_topk")
SLICE_KEYS = ("sources", "base_model", "residual_weight", "parameters")
SOURCE_KEYS = ("model", "layer_range", "parameters")
MODEL_KEYS = ("model", "parameters")

# mergekit's defaults for what vecmerge's flags leave unset (vecmerge's own defaults agree for the others)
DEFAULTS = {"ties": {"normalize": True, "rescale": False}, "dare_ties": {"normalize": False, "rescale": True},
            "dare_linear": {"normalize": False, "rescale": True}, "linear": {"normalize": True}}


def did_you_mean(word: object, vocabulary: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest word of ``vocabulary`` (difflib, cutoff 0.6), else ``""``.

    Args:
        word (object): what the file says. vocabulary (Iterable[str]): mergekit's words for that place.
    """
    close = difflib.get_close_matches(str(word), list(vocabulary), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def meaning_notes(mk: str, has_base: bool, weights: list[float | None]) -> list[str]:
    """Where the translated merge means something else than mergekit's on the same file (one line each).

    mergekit merges full weights ``W0 + x_i``; vecmerge merges the updates ``x_i`` with the base at the origin.
    The two agree for the methods linear in the updates and for those that subtract the base themselves
    (the task-vector methods; nuslerp and multislerp with a base_model); they differ where mergekit
    interpolates whole weights: slerp, karcher, and nuslerp or multislerp without a base_model.

    Args:
        mk (str): mergekit's merge_method. has_base (bool): the file names a base_model.
        weights (list[float | None]): the models' weights as the file gives them (None: not given).
    """
    full = ("mergekit interpolates the full weights W0 + x_i, vecmerge the updates x_i (the base at the origin): "
            "the angles differ, so the result is not mergekit's on the merged model")
    notes = []
    if mk == "slerp":
        notes.append(f"slerp: {full}")
    elif mk in ("nuslerp", "multislerp") and not has_base:
        notes.append(f"{mk} without base_model: {full} (with a base_model mergekit subtracts it too, as here)")
    elif mk == "karcher":
        notes.append("karcher: mergekit averages full weights on the sphere (with base_model, the base W0 is one "
                     "of them), vecmerge the updates of the models (the base at the origin): the result differs")
    if mk in ("linear", "task_arithmetic") and any(w is not None and w < 0 for w in weights):
        notes.append(f"{mk} with a negative weight: the output subtracts that model's update (weights 1, -1 write "
                     "the difference of the two updates)")
    return notes
