"""Really trained toy LoRA trajectories on a tiny random Qwen3, for demos and tests.

``make_trajectories`` trains PEFT LoRA adapters on a synthetic next-token rule on the CPU, named as in the
user's story (``v58 = v54 + alpha * (v51 - v28)``): ``v28`` (rsLoRA), ``v51`` (v28 trained further),
``v54e2`` and ``v54`` (a second run after epochs 2 and 3, bfloat16). ``evaluate_checkpoints`` measures them
as an eval on random subsets does: several runs per checkpoint on fresh held-out sequences, split into
three sub-tasks (``SUBTASKS``). What the two differences share: docs/design/demo.md.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import pathlib
import warnings
from collections.abc import Iterator

import torch

__all__ = ["make_trajectories", "evaluate_checkpoints", "write_probe_prompts", "LINEAGE", "HISTORY", "METRIC",
           "SUBTASKS"]

TARGET_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
_VOCAB = 128  # synthetic vocabulary size
_BATCH = 16  # sequences per step
_SEQ_LEN = 32  # tokens per sequence
_NOISE = 0.1  # probability that a token breaks the rule
_LR = 1e-3  # AdamW learning rate of v28 and of the backbone run; v51 uses 3x
LINEAGE = {"v28": None, "v51": "v28", "v54e2": None, "v54": "v54e2"}  # parent: keys of vecmerge.yaml (None: a root)
# With history=True, each run's other half epochs are kept too (v28_h1: the v28 run after half an epoch): with the
# four above, 12 past models, as many as the user calibrated proxies on. They are folders, not workspace entries.
HISTORY = ("v28_h1", "v28_h2", "v28_h3", "v51_h1", "v54_h1", "v54_h2", "v54_h3", "v54_h5")
METRIC = "toy_acc"  # evaluate_checkpoints' metric: next-token accuracy on held-out sequences
SUBTASKS = ("start_low", "start_mid", "start_high")  # the toy task's sub-tasks: the third of the vocabulary a
# sequence starts in (each run's sub-score is its items' mean accuracy in that sub-task)


def _check_args(layers: int, hidden: int, rank: int, steps: int) -> None:
    for name, value in (("layers", layers), ("rank", rank), ("steps", steps)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    if not isinstance(hidden, int) or isinstance(hidden, bool) or hidden < 8 or hidden % 8:
        raise ValueError(f"hidden must be a positive multiple of 8 (4 heads, even head_dim), got {hidden!r}")


@contextlib.contextmanager
def _quiet_and_deterministic(seed: int) -> Iterator[None]:
    """Fork the global RNG, run single-threaded, mute transformers/peft logs, warnings and bars."""
    from transformers.utils import logging as hf_logging

    threads = torch.get_num_threads()
    peft_logger = logging.getLogger("peft")
    peft_level, hf_verbosity = peft_logger.level, hf_logging.get_verbosity()
    hf_bars = hf_logging.is_progress_bar_enabled()
    with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            torch.set_num_threads(1)
            peft_logger.setLevel(logging.ERROR)
            hf_logging.set_verbosity_error()
            hf_logging.disable_progress_bar()
            torch.manual_seed(seed)
            yield
        finally:
            torch.set_num_threads(threads)
            peft_logger.setLevel(peft_level)
            hf_logging.set_verbosity(hf_verbosity)
            if hf_bars:
                hf_logging.enable_progress_bar()


def _rule(gen: torch.Generator) -> tuple[int, int]:
    """The toy task's rule ``next = (a * tok + b) mod V``: ``(a, b)`` drawn from ``gen`` (a odd)."""
    a = 2 * int(torch.randint(1, _VOCAB // 2, (1,), generator=gen)) + 1  # odd, so invertible mod V
    b = int(torch.randint(0, _VOCAB, (1,), generator=gen))
    return a, b


def _sequences(gen: torch.Generator, a: int, b: int, n: int) -> torch.Tensor:
    """``n`` sequences of the rule, with a token in ten random: a (n, SEQ_LEN) long tensor."""
    x = torch.empty(n, _SEQ_LEN, dtype=torch.long)
    x[:, 0] = torch.randint(0, _VOCAB, (n,), generator=gen)
    for t in range(1, _SEQ_LEN):
        noisy = torch.rand(n, generator=gen) < _NOISE
        random_tok = torch.randint(0, _VOCAB, (n,), generator=gen)
        x[:, t] = torch.where(noisy, random_tok, (a * x[:, t - 1] + b) % _VOCAB)
    return x


def _make_data(seed: int, n_batches: int) -> list[torch.Tensor]:
    """Token batches following ``next = (a * tok + b) mod V``, with a token in ten random."""
    gen = torch.Generator().manual_seed(seed)
    a, b = _rule(gen)
    return list(_sequences(gen, a, b, n_batches * _BATCH).split(_BATCH))


def _train(model, data: list[torch.Tensor], start: int, n_steps: int, optimizer, bar) -> int:
    """Run ``n_steps`` AdamW steps cycling through ``data`` from batch ``start``; return the next batch."""
    model.train()
    for i in range(start, start + n_steps):
        ids = data[i % len(data)]
        loss = model(input_ids=ids, labels=ids).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        bar.update(1)
        bar.set_postfix(loss=f"{loss.item():.3f}", refresh=False)
    return start + n_steps


def _train_saving(model, data, start: int, n_steps: int, optimizer, bar, saves: dict, save) -> int:
    """``_train`` for ``n_steps``, calling ``save(name)`` after the steps ``saves`` ({step: name}) names."""
    done = 0
    for at, name in sorted(saves.items()):
        start, done = _train(model, data, start, at - done, optimizer, bar), at
        save(name)
    return _train(model, data, start, n_steps - done, optimizer, bar)


def _save_adapter(model, path: pathlib.Path, base_path: str, dtype: torch.dtype | None = None) -> None:
    """``save_pretrained`` the LoRA weights (cast to ``dtype`` if given) as safetensors."""
    config = model.peft_config["default"]
    config.base_model_name_or_path = base_path
    config.target_modules = sorted(config.target_modules)  # PEFT keeps a set: fix the JSON order
    state = None
    if dtype is not None:
        state = {k: v.detach().to(dtype) for k, v in model.state_dict().items() if "lora_" in k}
    model.save_pretrained(str(path), safe_serialization=True, state_dict=state)


def make_trajectories(
    out: str | os.PathLike,
    *,
    seed: int = 0,
    layers: int = 2,
    hidden: int = 64,
    rank: int = 8,
    steps: int = 60,
    progress: bool = False,
    history: bool = False,
) -> dict[str, pathlib.Path]:
    """Train toy LoRA trajectories ``v28``, ``v51``, ``v54e2`` and ``v54`` on a tiny random Qwen3.

    On the CPU, from configs (no hub): the base to ``out/base``, each adapter to ``out/<name>`` (PEFT's
    ``save_pretrained``), and ``out/vecmerge.yaml`` with their lineage (``LINEAGE``). Byte-identical for a
    given ``seed`` on a given machine. The training schedule: docs/design/demo.md.

    Args:
        out (str | os.PathLike): folder to write into; created if missing, files overwritten.
        seed (int): seed of the base weights, the data and the LoRA inits. Default: 0
        layers (int): number of decoder layers (>= 1). Default: 2
        hidden (int): hidden size, a multiple of 8 (4 heads, 2 KV heads). Default: 64
        rank (int): LoRA rank ``r`` (>= 1). Default: 8
        steps (int): training steps of ``v28`` (>= 1); sets the epoch length. Default: 60
        progress (bool): show a tqdm bar on stderr. Default: False
        history (bool): also keep each run's checkpoints every half epoch (``HISTORY``: ``v28_h1`` .. ``v28_h3``,
            ``v51_h1``, ``v54_h1`` .. ``v54_h3``, ``v54_h5``; folders of ``out``, not in ``vecmerge.yaml``), the four
            above unchanged. Default: False

    Returns:
        dict[str, pathlib.Path]: absolute folders keyed ``base``, ``v28``, ``v51``, ``v54e2``, ``v54``.

    Raises:
        ValueError: if ``layers``, ``rank`` or ``steps`` is below 1, or ``hidden`` is not a
            positive multiple of 8.

    Example:
        >>> paths = make_trajectories("toy", layers=1, steps=10)
        >>> sorted(paths)
        ['base', 'v28', 'v51', 'v54', 'v54e2']
    """
    _check_args(layers, hidden, rank, steps)
    if history and steps < 4:
        raise ValueError(f"history=True keeps quarter-runs: steps must be >= 4, got {steps}")

    root = pathlib.Path(out).resolve()
    paths = {name: root / name for name in ("base", *LINEAGE, *(HISTORY if history else ()))}
    base_path = str(paths["base"])
    epoch = max(1, math.ceil(steps / 2))
    half = max(1, epoch // 2)
    kept = (lambda pairs: {at: name for at, name in pairs if 0 < at}) if history else (lambda pairs: {})
    total = steps + epoch + 3 * epoch

    from peft import LoraConfig, PeftModel, get_peft_model
    from tqdm.auto import tqdm
    from transformers import AutoModelForCausalLM, Qwen3Config, Qwen3ForCausalLM

    root.mkdir(parents=True, exist_ok=True)

    with (
        _quiet_and_deterministic(seed),
        tqdm(total=total, desc="toy trajectories", disable=not progress, leave=False) as bar,
    ):
        config = Qwen3Config(
            vocab_size=_VOCAB,
            hidden_size=hidden,
            intermediate_size=2 * hidden,
            num_hidden_layers=layers,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=hidden // 4,
            max_position_embeddings=256,
            # ~1/sqrt(hidden) rather than 0.02, so the lm_head can give confident logits,
            # as a pretrained model would; this makes the LoRA task learnable in few steps.
            initializer_range=1.2 / math.sqrt(hidden),
            tie_word_embeddings=False,
            use_cache=False,
        )
        Qwen3ForCausalLM(config).save_pretrained(base_path, safe_serialization=True)
        data = _make_data(seed + 1, epoch)

        def fresh_base():
            return AutoModelForCausalLM.from_pretrained(base_path, dtype=torch.float32)

        def lora(alpha: int, rslora: bool, init_seed: int):
            torch.manual_seed(init_seed)  # lora_A's kaiming init draws from the global RNG
            cfg = LoraConfig(
                r=rank,
                lora_alpha=alpha,
                lora_dropout=0.0,
                use_rslora=rslora,
                target_modules=list(TARGET_MODULES),
                task_type="CAUSAL_LM",
            )
            return get_peft_model(fresh_base(), cfg)

        def adamw(model, lr: float):
            return torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)

        bar.set_description("v28")
        model = lora(rank, True, seed + 2)
        saves = kept([(k * steps // 4, f"v28_h{k}") for k in (1, 2, 3)])
        nxt = _train_saving(model, data, 0, steps, adamw(model, _LR), bar, saves,
                            lambda name: _save_adapter(model, paths[name], base_path))
        _save_adapter(model, paths["v28"], base_path)

        bar.set_description("v51")
        model = PeftModel.from_pretrained(fresh_base(), str(paths["v28"]), is_trainable=True)
        _train_saving(model, data, nxt, epoch, adamw(model, 3 * _LR), bar, kept([(half, "v51_h1")]),
                      lambda name: _save_adapter(model, paths[name], base_path))
        _save_adapter(model, paths["v51"], base_path)

        bar.set_description("v54")
        model = lora(2 * rank, False, seed + 3)
        optimizer = adamw(model, _LR)
        def save_bf16(name):
            _save_adapter(model, paths[name], base_path, torch.bfloat16)

        nxt = _train_saving(model, data, 0, 2 * epoch, optimizer, bar,
                            kept([(half, "v54_h1"), (epoch, "v54_h2"), (epoch + half, "v54_h3")]), save_bf16)
        save_bf16("v54e2")
        _train_saving(model, data, nxt, epoch, optimizer, bar, kept([(half, "v54_h5")]), save_bf16)
        save_bf16("v54")

    (root / "vecmerge.yaml").write_text(
        "base_model: base\nadapters:\n"
        + "".join(f"  {name}: {{path: {name}, parent: {parent or 'null'}}}\n" for name, parent in LINEAGE.items()),
        encoding="utf-8",
    )
    return paths


def evaluate_checkpoints(
    out: str | os.PathLike,
    names: list[str],
    *,
    seed: int = 0,
    runs: int = 5,
    subset: int = 64,
    pool: int = 512,
    metric: str = METRIC,
) -> list[dict]:
    """Evaluate each adapter ``runs`` times on fresh random subsets of held-out sequences of the toy task.

    An item is one of ``pool`` held-out sequences of the training rule, scored by its next-token accuracy over
    ``SEQ_LEN - 1`` positions (base + adapter, loaded by PEFT); a run is the mean over ``subset`` items drawn
    afresh. Item sub-task: ``SUBTASKS[first_token * 3 // V]``. Why its spread is real eval noise:
    docs/design/demo.md.

    Args:
        out (str | os.PathLike): the folder ``make_trajectories`` wrote (its ``base`` and adapters).
        names (list[str]): adapter folders in ``out`` to evaluate, in order.
        seed (int): the trajectories' seed (the rule), also seeding the pool and the subsets. Default: 0
        runs (int): runs per model (>= 1). Default: 5
        subset (int): items per run (1 <= subset <= pool). Default: 64
        pool (int): held-out sequences. Default: 512
        metric (str): the metric name of the records. Default: ``toy_acc``

    Returns:
        list[dict]: ledger CSV rows ``{"model", "metric", "value", "item", "note", "subscore", "sub.<task>"...}``:
        one row per run (``item`` None, a ``sub.<task>`` value per sub-task it drew items of), then one per item of
        that run (``item`` ``seqN``, ``subscore`` its sub-task).
    """
    if not (isinstance(runs, int) and runs >= 1 and isinstance(subset, int) and 1 <= subset <= pool):
        raise ValueError(f"runs >= 1 and 1 <= subset <= pool are needed, got runs={runs}, subset={subset}, "
                         f"pool={pool}")
    root = pathlib.Path(out).resolve()
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    rows = []
    with _quiet_and_deterministic(seed):
        gen = torch.Generator().manual_seed(seed + 1)  # the training data's rule
        a, b = _rule(gen)
        held_out = _sequences(torch.Generator().manual_seed(seed + 1000), a, b, pool)
        task_of = [SUBTASKS[int(x) * len(SUBTASKS) // _VOCAB] for x in held_out[:, 0].tolist()]
        draws = torch.Generator().manual_seed(seed + 2000)
        for name in names:
            base = AutoModelForCausalLM.from_pretrained(str(root / "base"), dtype=torch.float32)
            model = PeftModel.from_pretrained(base, str(root / name)).eval()
            with torch.no_grad():
                logits = model(input_ids=held_out).logits
            per_item = (logits[:, :-1].argmax(-1) == held_out[:, 1:]).double().mean(1).tolist()
            for r in range(runs):
                picked = torch.randperm(pool, generator=draws)[:subset].tolist()
                note = f"run {r + 1} of {runs}: {subset} random items of {pool} held-out sequences"
                subs = {}
                for task in SUBTASKS:
                    mine = [per_item[i] for i in picked if task_of[i] == task]
                    if mine:
                        subs[f"sub.{task}"] = sum(mine) / len(mine)
                rows.append({"model": name, "metric": metric, "value": sum(per_item[i] for i in picked) / subset,
                             "item": None, "note": note, **subs})
                rows += [{"model": name, "metric": metric, "value": per_item[i], "item": f"seq{i}", "note": None,
                          "subscore": task_of[i]} for i in picked]
    return rows


def write_probe_prompts(path: str | os.PathLike, *, seed: int = 0, items: int = 64, prompt: int = 16) -> pathlib.Path:
    """A ``vecmerge probe`` prompt file of held-out sequences of the toy task: ``prompt`` tokens, then the rest.

    The sequences follow the training rule (the rule of ``make_trajectories``' data for the same ``seed``), drawn
    afresh (neither the training data nor ``evaluate_checkpoints``' pool); each line is
    ``{"id": "hN", "prompt_ids": [...], "target_ids": [...], "task": SUBTASK}`` with ``SEQ_LEN - prompt`` target
    tokens, its task the sub-task of ``evaluate_checkpoints`` (the third of the vocabulary its first token is in).

    Args:
        path (str | os.PathLike): the JSON Lines file to write. seed (int): the trajectories' seed. Default: 0
        items (int): how many sequences. Default: 64
        prompt (int): prompt tokens of each (1 <= prompt < SEQ_LEN). Default: 16
    """
    import json

    if not (isinstance(prompt, int) and 1 <= prompt < _SEQ_LEN and isinstance(items, int) and items >= 1):
        raise ValueError(f"items >= 1 and 1 <= prompt < {_SEQ_LEN} are needed, got items={items}, prompt={prompt}")
    a, b = _rule(torch.Generator().manual_seed(seed + 1))
    seqs = _sequences(torch.Generator().manual_seed(seed + 3000), a, b, items).tolist()
    path = pathlib.Path(path)
    path.write_text("".join(json.dumps({"id": f"h{i}", "prompt_ids": x[:prompt], "target_ids": x[prompt:],
                                        "task": SUBTASKS[x[0] * len(SUBTASKS) // _VOCAB]}) + "\n"
                            for i, x in enumerate(seqs)), encoding="utf-8")
    return path
