"""``vecmerge probe``'s work: each adapter on the base, teacher-forced on a prompt file; scores, divergences, records.

    load_cache       what the ledger holds for these adapters' hashes and this file (``records``)
    needs            item -> the models that must run on it (records or pair divergences missing)
    batches          items grouped by that set of models, sorted by length, ``batch`` at a time (right-padded)
    per batch        each model's hooks, one forward pass, the target positions' logits; ``scores.item_scores``
                     per model, ``scores.divergences`` per pair; the new records in one transaction
    end              whole-run records of complete models; the results from cached and new records alike

The base is loaded once, in float32, on ``device`` (not at all when nothing is missing). A re-run of the same
adapters and file computes and records nothing. Memory: docs/design/probe.md.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import ModelError, UsageError
from ..evidence.ledger.ledger import Ledger
from ..io.files import check_folder
from ..peft.adapter import Adapter
from . import records
from .hooks import LoraHooks, module_updates
from .prompts import PromptSet, model_context
from .quiet import quiet_libraries
from .scores import divergences, item_scores
from .space import function_map
from .summary import model_summary, pair_means, task_changes


@dataclass(frozen=True)
class ProbeModel:
    """One adapter to probe: its name (the ledger's model), the opened folder and its content sha256."""

    name: str
    adapter: Adapter
    sha256: str | None


@dataclass(frozen=True)
class ProbeResult:
    """Everything a probe found (``to_dict`` is ``--json``).

    Args:
        prompts (dict): path, sha256, stem, items, tokenized. models (dict): name -> {"sha256", "items": {id: {loglik,
        tokens, exact, first_rank, task, cluster}}, "summary"}. pairs (list[dict]): {"a", "b", "kl_ab", "kl_ba", "js",
        "items"}. map (dict): ``space.function_map``. computed (dict): forwards run per model and batches.
        recorded (dict): records and pair records written, the ledger (None: not recorded). device (str).
    """

    prompts: dict
    models: dict
    pairs: list
    map: dict
    computed: dict
    recorded: dict
    device: str

    def to_dict(self) -> dict:
        return {"prompts": self.prompts, "models": self.models, "pairs": self.pairs, "map": self.map,
                "computed": self.computed, "recorded": self.recorded, "device": self.device}


def load_base(folder: Path, device: torch.device, dtype=torch.float32):
    """The base model (``AutoModelForCausalLM``), in ``dtype``, on ``device``, in eval mode."""
    from transformers import AutoModelForCausalLM

    check_folder(folder)  # transformers opens the files it picks: a FIFO among them would hang it
    try:
        with quiet_libraries():
            model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=dtype)
    except Exception as e:  # anything transformers raises is the finding
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ModelError(f"--base-model {folder}: transformers cannot load it ({type(e).__name__}: {msg[:160]}); "
                         "give a local causal language model folder") from None
    return model.to(device).eval()  # type: ignore[arg-type]


def _keeps_positions(model) -> bool:
    """Whether the model's forward takes a boolean (batch, length) ``logits_to_keep`` (transformers >= 5)."""
    import transformers.modeling_utils as mu

    return hasattr(mu, "slice_logits_to_keep") and "logits_to_keep" in inspect.signature(model.forward).parameters


def _batch_tensors(items, device):
    """Right-padded ids, attention mask, the target-position mask, the targets (row order) and each T."""
    length = max(it.length for it in items)
    ids = torch.zeros(len(items), length, dtype=torch.long)
    att = torch.zeros(len(items), length, dtype=torch.long)
    keep = torch.zeros(len(items), length, dtype=torch.bool)
    for j, it in enumerate(items):
        p, t = len(it.prompt_ids), len(it.target_ids)
        ids[j, :p + t] = torch.tensor(it.prompt_ids + it.target_ids)
        att[j, :p + t] = 1
        keep[j, p - 1:p + t - 1] = True
    targets = torch.tensor([t for it in items for t in it.target_ids], dtype=torch.long)
    return ids.to(device), att.to(device), keep.to(device), targets.to(device), [len(it.target_ids) for it in items]


def forward_logits(model, ids, att, keep, by_mask: bool) -> torch.Tensor:
    """(N, V) float32 logits of the kept positions, rows item after item."""
    with torch.inference_mode():
        if by_mask:
            return model(input_ids=ids, attention_mask=att, logits_to_keep=keep, use_cache=False).logits.float()
        return model(input_ids=ids, attention_mask=att, use_cache=False).logits[keep].float()


def _needs(prompts: PromptSet, models: list[ProbeModel], cache: records.Cache, pairs: bool) -> dict[str, frozenset]:
    need = {}
    for it in prompts.items:
        who = {m.name for m in models if it.id not in cache.items.get(m.name, {})}
        if pairs:
            for x, a in enumerate(models):
                for b in models[x + 1:]:
                    if cache.pair(a.sha256, b.sha256, it.id) is None:
                        who |= {a.name, b.name}
        if who:
            need[it.id] = frozenset(who)
    return need


def _batches(prompts: PromptSet, need: dict, size: int, order: list[str]) -> list[tuple[list[str], list]]:
    groups: dict[frozenset, list] = {}
    for it in prompts.items:
        if it.id in need:
            groups.setdefault(need[it.id], []).append(it)
    out = []
    for who, items in groups.items():
        items = sorted(items, key=lambda it: (-it.length, it.line))
        names = [n for n in order if n in who]
        out += [(names, items[i:i + size]) for i in range(0, len(items), size)]
    return out


def run_probe(base_model, models: list[ProbeModel], prompts: PromptSet, *, ledger: Ledger | None = None,
              batch: int = 8, pairs: bool = True, device="cpu", progress=None) -> ProbeResult:
    """Probe ``models`` on ``prompts`` (module docstring); record what is new in ``ledger`` (None: record nothing).

    Args:
        base_model (str | Path): the base model folder. models (list[ProbeModel]): distinct names.
        prompts (PromptSet): the items. batch (int): items per forward pass. pairs (bool): KL and JS per pair.
        device (str | torch.device): where the forward passes run. progress: an optional iterable wrapper.
    """
    if batch < 1:
        raise UsageError(f"--batch {batch}: at least 1 item per forward pass")
    names = [m.name for m in models]
    if len(set(names)) != len(names) or not names:
        raise UsageError(f"probe: name each adapter once (got {', '.join(names) or 'none'})")
    device = torch.device(device)
    shas = {m.name: m.sha256 for m in models}
    if ledger is not None:
        records.check_stem(ledger, prompts)
    cache = records.load_cache(ledger, prompts, shas) if ledger is not None else records.Cache()
    pairs = pairs and len(models) > 1
    need = _needs(prompts, models, cache, pairs)
    new_items: dict[str, dict] = {m.name: {} for m in models}
    new_pairs: dict[tuple, dict] = {}
    counts = {"records": 0, "pair_records": 0}
    work = _batches(prompts, need, batch, names)
    if work:
        model = load_base(Path(base_model), device)
        prompts.check_vocab(model.get_input_embeddings().num_embeddings, f"--base-model {base_model}")
        prompts.check_context(model_context(model.config), f"--base-model {base_model}")
        by_name = {m.name: m for m in models}
        used = {n for who, _ in work for n in who}
        updates = {n: module_updates(by_name[n].adapter, model, device=device) for n in names if n in used}
        by_mask = _keeps_positions(model)
        with LoraHooks(model, {k for u in updates.values() for k in u}) as hooks:
            for who, items in (progress(work) if progress else work):
                ids, att, keep, targets, lengths = _batch_tensors(items, device)
                logits = {}
                for n in who:
                    hooks.use(updates[n])
                    logits[n] = forward_logits(model, ids, att, keep, by_mask)
                hooks.use(None)
                entries, rows = [], []
                for n in who:
                    s = item_scores(logits[n], targets, lengths)
                    fresh = {it.id: {k: s[k][j] for k in records.ITEM_METRICS} for j, it in enumerate(items)
                             if it.id not in cache.items.get(n, {})}
                    new_items[n].update(fresh)
                    entries += records.item_entries(prompts, n, shas[n], fresh)
                todo = [(a, b) for x, a in enumerate(who) for b in who[x + 1:]]
                for (a, b), d in divergences(logits, todo if pairs else [], lengths).items():
                    fresh = {it.id: {k: d[k][j] for k in d} for j, it in enumerate(items)
                             if cache.pair(shas[a], shas[b], it.id) is None}
                    new_pairs.setdefault((a, b), {}).update(fresh)
                    rows += records.pair_entries(prompts, (a, shas[a]), (b, shas[b]), fresh)
                if ledger is not None and (entries or rows):
                    n_rec, n_pairs = records.write(ledger, prompts, entries, rows)
                    counts["records"] += n_rec
                    counts["pair_records"] += n_pairs
    return _assemble(prompts, models, cache, new_items, new_pairs, pairs, ledger, counts, work, device)


def _assemble(prompts, models, cache, new_items, new_pairs, pairs, ledger, counts, work, device) -> ProbeResult:
    by_id, summaries = prompts.by_id(), []
    out_models: dict = {}
    for m in models:
        scores = {**cache.items.get(m.name, {}), **new_items[m.name]}
        items = {i: {"loglik": scores[i]["loglik"], "tokens": len(by_id[i].target_ids),
                     "exact": int(scores[i]["exact"]), "first_rank": int(scores[i]["first_rank"]),
                     "task": by_id[i].task, "cluster": by_id[i].cluster} for i in prompts.ids}
        summary = model_summary(items)
        if out_models:  # per task, the change from the first model (the reference)
            summary["changes"] = {"from": models[0].name, "tasks": task_changes(items, out_models[models[0].name]
                                                                                ["items"])}
        out_models[m.name] = {"sha256": m.sha256, "items": items, "summary": summary}
        if ledger is not None and m.name not in cache.summarized:
            summaries += records.summary_entries(prompts, m.name, m.sha256, summary)
    if summaries:
        n_rec, _ = records.write(ledger, prompts, summaries, [])
        counts["records"] += n_rec
    pair_rows, pair_items = [], []
    if pairs:
        for x, a in enumerate(models):
            for b in models[x + 1:]:
                values = {i: new_pairs.get((a.name, b.name), {}).get(i) or cache.pair(a.sha256, b.sha256, i)
                          for i in prompts.ids}
                pair_rows.append({"a": a.name, "b": b.name, **pair_means(values)})
                pair_items.append({"a": a.name, "b": b.name, "items": values})
    info = {"path": str(prompts.path), "sha256": prompts.sha256, "stem": prompts.stem, "items": len(prompts.items),
            "tokenized": prompts.tokenized}
    forwards = {m.name: sum(len(items) for who, items in work if m.name in who) for m in models}
    return ProbeResult(info, out_models, pair_rows, function_map(out_models, prompts.ids, pair_items),
                       {"forwards": forwards, "batches": len(work)},
                       {**counts, "ledger": None if ledger is None else str(ledger.path)}, str(device))
