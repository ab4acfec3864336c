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


def answer(t: int, x: int) -> int:
    return 30 + (x + 7 * t) % 30


def batch(tasks) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ids, labels)`` of every item of ``tasks``: ``[marker, x, answer]``, the answer the only label."""
    ids = torch.tensor([[MARKERS[t], x, answer(t, x)] for t in tasks for x in XS])
    labels = ids.clone()
    labels[:, :2] = -100
    return ids, labels


def train(model, tasks, steps: int, lr: float) -> None:
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    ids, labels = batch(tasks)
    model.train()
    for _ in range(steps):
        model(input_ids=ids, labels=labels).loss.backward()
        opt.step()
        opt.zero_grad()
    model.eval()


def build(root: Path) -> Path:
    """Into ``root``: a tiny Qwen3 base (its output head scaled x25, so that a normed hidden state can reach
    confident logits), adapters bb (tasks 1 and 2) and t0 (bb trained further on task 0), one prompt file per
    task; returns the base model folder."""
    import transformers as tf
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        base = tf.Qwen3ForCausalLM(tf.Qwen3Config(**TINY_DECODER))
        base.lm_head.weight.data *= 25
        base.save_pretrained(root / "base")
        model = get_peft_model(base, LoraConfig(r=8, lora_alpha=16, target_modules=list(TARGETS)))
        train(model, (1, 2), 100, 1e-2)
        model.save_pretrained(root / "bb")
        train(model, (0,), 30, 3e-3)
        model.save_pretrained(root / "t0")
    for t in range(3):
        (root / f"task{t}.jsonl").write_text("".join(
            json.dumps({"id": x, "prompt_ids": [MARKERS[t], x], "target_ids": [answer(t, x)], "task": f"t{t}"})
            + "\n" for x in XS))
    return root / "base"


def loglik(base: Path, updates: dict) -> list[float]:
    """Mean target log-likelihood per task with ``updates`` (dense, float64) added by the test's own hooks."""
    from transformers import AutoModelForCausalLM

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float64).eval()
    hs = [model.get_submodule(m).register_forward_hook(lambda mod, a, o, W=W: o + a[0] @ W.T)
          for m, W in updates.items()]
    out = []
    with torch.no_grad():
        for t in range(3):
            ids, _ = batch((t,))
            logp = torch.log_softmax(model(input_ids=ids).logits[:, 1], -1)
            out.append(float(logp[torch.arange(len(ids)), ids[:, 2]].mean()))
    for h in hs:
        h.remove()
    return out
