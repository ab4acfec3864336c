"""A probe's results in the evaluation ledger: metric names, the records it writes, and what it already holds.

Per model and item: ``probe:<stem>:loglik`` (higher is better), ``probe:<stem>:exact`` (higher is better),
``probe:<stem>:first_rank`` (lower is better); once every item is recorded, one whole-run record per model of
each (sub-scores per ``task``) plus ``probe:<stem>:loglik_per_token``; per pair and item (``evidence.pairs``)
``probe:<stem>:kl`` and ``probe:<stem>:js``. Every record is tied to its adapter's content sha256 and, through
its source ``probe:<file name>@<sha256>``, to the prompt file's bytes; what the ledger holds is not computed
again, and records of another file under the same stem are refused (``check_stem``).
More on how the other commands read them: docs/design/probe.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..errors import UsageError
from ..evidence.ledger import pairs as pair_records
from ..evidence.ledger.ledger import Entry, Ledger
from .prompts import PromptSet

ITEM_METRICS = ("loglik", "exact", "first_rank")
RUN_METRICS = ("loglik", "loglik_per_token", "exact", "first_rank")
PAIR_METRICS = ("kl", "js")
HIGHER_IS_BETTER = {"loglik": True, "loglik_per_token": True, "exact": True, "first_rank": False}


def metric(stem: str, what: str) -> str:
    """``probe:<stem>:<what>``."""
    return f"probe:{stem}:{what}"


def source(prompts: PromptSet) -> str:
    """``probe:<file name>@<sha256>``: the records' tie to the prompt file's bytes."""
    return f"probe:{prompts.path.name}@{prompts.sha256}"


def directions(stem: str) -> dict[str, bool]:
    """Each probe metric's direction, declared with the first records."""
    return {metric(stem, k): v for k, v in HIGHER_IS_BETTER.items()}


@dataclass
class Cache:
    """What the ledger holds of this prompt file for the models' current hashes.

    items: name -> item -> {loglik, exact, first_rank}. pairs: (sha_a, sha_b) -> item -> {kl_ab, kl_ba, js}
    (both orders). summarized: names with their whole-run records already written.
    """

    items: dict = field(default_factory=dict)
    pairs: dict = field(default_factory=dict)
    summarized: set = field(default_factory=set)

    def pair(self, sha_a, sha_b, item) -> dict | None:
        return self.pairs.get((sha_a, sha_b), {}).get(item)


def check_stem(ledger: Ledger, prompts: PromptSet) -> None:
    """UsageError when the ledger holds ``probe:<stem>:*`` records of another prompt file (other bytes)."""
    mine = source(prompts)
    other = {r.source for r in ledger.records(metric=metric(prompts.stem, "loglik")) if r.source != mine}
    if other:
        old = sorted(other)[0].rsplit("@", 1)[-1][:12]
        raise UsageError(f"--prompts {prompts.path}: the ledger {ledger.path} already holds probe:{prompts.stem}:* "
                         f"records of another prompt file (sha256 {old}...); a metric name stands for one file: "
                         "rename the file or pass --name NAME")


def load_cache(ledger: Ledger, prompts: PromptSet, shas: dict[str, str | None]) -> Cache:
    """What ``ledger`` holds for ``prompts`` and each model's current sha256 (``shas``: name -> sha256)."""
    cache, src, names = Cache(), source(prompts), list(shas)
    for what in ITEM_METRICS:
        for r in ledger.records(names, metric(prompts.stem, what), current_sha=shas, level="item"):
            if r.source == src and r.sha256 == shas[r.model]:
                cache.items.setdefault(r.model, {}).setdefault(r.item, {})[what] = r.value
    for name, items in cache.items.items():
        cache.items[name] = {i: v for i, v in items.items() if len(v) == len(ITEM_METRICS)}
    for r in ledger.records(names, metric(prompts.stem, "loglik"), current_sha=shas, level="run"):
        if r.source == src and r.sha256 == shas[r.model]:
            cache.summarized.add(r.model)
    by_metric = {m: metric(prompts.stem, m) for m in PAIR_METRICS}
    for p in pair_records.records(ledger, by_metric.values(), src):
        slot = cache.pairs.setdefault((p.sha_a, p.sha_b), {}).setdefault(p.item, {})
        if p.metric == by_metric["kl"]:
            slot["kl_ab"] = p.value
            cache.pairs.setdefault((p.sha_b, p.sha_a), {}).setdefault(p.item, {})["kl_ba"] = p.value
        else:
            slot["js"] = p.value
            cache.pairs.setdefault((p.sha_b, p.sha_a), {}).setdefault(p.item, {})["js"] = p.value
    for key, items in cache.pairs.items():
        cache.pairs[key] = {i: v for i, v in items.items() if len(v) == 3}
    return cache


def item_entries(prompts: PromptSet, name: str, sha: str | None, scores: dict[str, dict]) -> list[Entry]:
    """Item-level entries of one model: ``scores`` item -> {loglik, exact, first_rank}."""
    by_id, src = prompts.by_id(), source(prompts)
    return [Entry(name, metric(prompts.stem, what), float(s[what]), sha, item=i, cluster=by_id[i].cluster, source=src)
            for i, s in scores.items() for what in ITEM_METRICS]


def pair_entries(prompts: PromptSet, a: tuple, b: tuple, values: dict[str, dict]) -> list:
    """Pair entries of models ``a`` and ``b`` ((name, sha256) each): ``values`` item -> {kl_ab, kl_ba, js}.

    An item with an infinite KL (a token one model rules out, logit -inf, that the other allows) is not recorded
    (the ledger holds finite numbers only): it is shown, and computed again by the next probe.
    """
    src, kl, js = source(prompts), metric(prompts.stem, "kl"), metric(prompts.stem, "js")
    out = []
    for item, v in values.items():
        if not all(math.isfinite(x) for x in v.values()):
            continue
        out += [pair_records.PairEntry(kl, item, a[0], a[1], b[0], b[1], v["kl_ab"], src),
                pair_records.PairEntry(kl, item, b[0], b[1], a[0], a[1], v["kl_ba"], src),
                pair_records.PairEntry(js, item, a[0], a[1], b[0], b[1], v["js"], src)]
    return out


def summary_entries(prompts: PromptSet, name: str, sha: str | None, summary: dict) -> list[Entry]:
    """Whole-run entries of one model from its ``summary`` (``summary.model_summary``): one per ``RUN_METRICS``."""
    src = source(prompts)
    note = f"probe of {summary['items']} items of {prompts.path.name}"
    return [Entry(name, metric(prompts.stem, what), float(summary[what]), sha,
                  tuple(sorted((t, float(s[what])) for t, s in summary["tasks"].items())), source=src, note=note)
            for what in RUN_METRICS]


def write(ledger: Ledger, prompts: PromptSet, entries: list[Entry], pairs: list) -> tuple[int, int]:
    """Record ``entries`` and ``pairs`` in one transaction, declaring the probe metrics' directions."""
    ids, n_pairs = pair_records.write(ledger, entries, pairs, directions(prompts.stem))
    return len(ids), n_pairs
