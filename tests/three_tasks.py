"""A small model trained in the test on three tasks (shared by tests/pipeline and tests/search).

Three tasks share one input ``x`` and disagree on the answer: item ``[marker_t, x] -> 30 + (x + 7 t) mod 30``.
A LoRA backbone ``bb`` is trained on tasks 1 and 2; training it further on task 0 alone (the target) gives ``t0``,
so ``t0 - bb`` pulls every marker towards task 0's answers. ``task<t>.jsonl`` holds task t's 30 items.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import torch
from conftest import TARGETS, TINY_DECODER

MARKERS = (90, 91, 92)
XS = range(30)
APART = (range(30), range(60, 72), range(60, 72))  # ``apart``: the protected tasks read inputs the target does not


def answer(t: int, x: int) -> int:
    return 30 + (x + 7 * t) % 30


def inputs(t: int, apart: bool = False) -> range:
    """The inputs ``x`` of task t: 0..29 for every task, or with ``apart`` 0..29 for the target and 60..71 for the
    protected tasks (their inputs then span a smaller space the target's step can keep off)."""
    return APART[t] if apart else XS


def batch(tasks, apart: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ids, labels)`` of every item of ``tasks``: ``[marker, x, answer]``, the answer the only label."""
    ids = torch.tensor([[MARKERS[t], x, answer(t, x)] for t in tasks for x in inputs(t, apart)])
    labels = ids.clone()
    labels[:, :2] = -100
    return ids, labels


def train(model, tasks, steps: int, lr: float, apart: bool = False) -> None:
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    ids, labels = batch(tasks, apart)
    model.train()
    for _ in range(steps):
        model(input_ids=ids, labels=labels).loss.backward()
        opt.step()
        opt.zero_grad()
    model.eval()


def build(root: Path, apart: bool = False, shape: dict | None = None) -> Path:
    """Into ``root``: a tiny Qwen3 base (its output head scaled x25, so that a normed hidden state can reach
    confident logits), adapters bb (tasks 1 and 2) and t0 (bb trained further on task 0), one prompt file per
    task; returns the base model folder. ``apart``: the inputs of ``inputs``; ``shape``: over TINY_DECODER."""
    import transformers as tf
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        base = tf.Qwen3ForCausalLM(tf.Qwen3Config(**{**TINY_DECODER, **(shape or {})}))
        base.lm_head.weight.data *= 25
        base.save_pretrained(root / "base")
        model = get_peft_model(base, LoraConfig(r=8, lora_alpha=16, target_modules=list(TARGETS)))
        train(model, (1, 2), 100, 1e-2, apart)
        model.save_pretrained(root / "bb")
        train(model, (0,), 30, 3e-3, apart)
        model.save_pretrained(root / "t0")
    for t in range(3):
        (root / f"task{t}.jsonl").write_text("".join(
            json.dumps({"id": x, "prompt_ids": [MARKERS[t], x], "target_ids": [answer(t, x)], "task": f"t{t}"})
            + "\n" for x in inputs(t, apart)))
    return root / "base"


def load(base: Path):
    """The base model in float64, for the tests' own forward passes."""
    from transformers import AutoModelForCausalLM

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return AutoModelForCausalLM.from_pretrained(base, dtype=torch.float64).eval()


def item_logliks(model, updates: dict, apart: bool = False) -> list[torch.Tensor]:
    """Per task, each item's target log-likelihood with ``updates`` (dense, float64) added by the test's own
    hooks on ``model`` (``load``)."""
    hs = [model.get_submodule(m).register_forward_hook(lambda mod, a, o, W=W: o + a[0] @ W.T)
          for m, W in updates.items()]
    out = []
    try:
        with torch.no_grad():
            for t in range(3):
                ids, _ = batch((t,), apart)
                logp = torch.log_softmax(model(input_ids=ids).logits[:, 1], -1)
                out.append(logp[torch.arange(len(ids)), ids[:, 2]])
    finally:
        for h in hs:
            h.remove()
    return out


def loglik(base: Path, updates: dict, apart: bool = False) -> list[float]:
    """Mean target log-likelihood per task with ``updates`` (dense, float64) added by the test's own hooks."""
    return [float(x.mean()) for x in item_logliks(load(base), updates, apart)]
