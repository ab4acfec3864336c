"""A model's probe summary over its items, and a pair's divergences averaged over items.

Over a model's items i = 1..n with target lengths T_i (``scores`` formulas):

    loglik            (1/n) sum_i loglik_i                 (mean per item)
    loglik_per_token  sum_i loglik_i / sum_i T_i
    exact             (1/n) sum_i exact_i                  (share of targets greedy decoding reproduces)
    first_rank        (1/n) sum_i first_rank_i
    top1              share of items with first_rank_i = 1

and the same over each ``task``'s items (its sub-scores). Per task, a model's change from a reference model is the
paired mean ``(1/n_t) sum_{i in t} (loglik_i - ref_loglik_i)`` with its standard error ``sd / sqrt(n_t)`` (sample
sd of the paired differences; None below 2 items). A pair's ``kl_ab``, ``kl_ba`` and ``js`` are the means over
items of the per-item values (each already a mean over the item's target positions).
"""

from __future__ import annotations

import math


def _stats(rows: list[dict]) -> dict:
    n = len(rows)
    tokens = sum(r["tokens"] for r in rows)
    return {"items": n, "tokens": tokens, "loglik": math.fsum(r["loglik"] for r in rows) / n,
            "loglik_per_token": math.fsum(r["loglik"] for r in rows) / tokens,
            "exact": sum(r["exact"] for r in rows) / n, "first_rank": sum(r["first_rank"] for r in rows) / n,
            "top1": sum(r["first_rank"] == 1 for r in rows) / n}


def model_summary(items: dict[str, dict]) -> dict:
    """The summary of one model (module docstring) with ``tasks``: task -> the same figures over its items.

    Args:
        items (dict[str, dict]): item id -> {loglik, tokens, exact, first_rank, task}.
    """
    rows = list(items.values())
    tasks: dict[str, list] = {}
    for r in rows:
        if r.get("task") is not None:
            tasks.setdefault(r["task"], []).append(r)
    return {**_stats(rows), "tasks": {t: _stats(v) for t, v in sorted(tasks.items())}}


def pair_means(values: dict[str, dict]) -> dict:
    """``{"kl_ab", "kl_ba", "js", "items"}``: the means over items of ``values`` (item -> {kl_ab, kl_ba, js})."""
    n = len(values)
    return {**{k: math.fsum(v[k] for v in values.values()) / n for k in ("kl_ab", "kl_ba", "js")}, "items": n}


def task_changes(items: dict[str, dict], ref: dict[str, dict]) -> dict:
    """Per task (and ``all``), the paired change of loglik from ``ref`` (module docstring): ``{task: {"change",
    "se", "items", "lower"}}``, ``lower`` the number of items whose loglik fell.

    Args:
        items, ref (dict[str, dict]): item id -> {loglik, task} of the model and of the reference, same ids.
    """
    groups: dict[str, list] = {"all": []}
    for i, r in items.items():
        d = r["loglik"] - ref[i]["loglik"]
        groups["all"].append(d)
        if r.get("task") is not None:
            groups.setdefault(r["task"], []).append(d)
    out = {}
    for t, ds in groups.items():
        n = len(ds)
        mean = math.fsum(ds) / n
        sd = math.sqrt(math.fsum((d - mean) ** 2 for d in ds) / (n - 1)) if n > 1 else None
        out[t] = {"change": mean, "se": None if sd is None else sd / math.sqrt(n), "items": n,
                  "lower": sum(d < 0 for d in ds)}
    return out
