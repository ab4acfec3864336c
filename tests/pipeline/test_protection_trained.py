"""A protected step on a small model trained in the test on three tasks: it costs the protected tasks less.

Three tasks share one input ``x`` and disagree on the answer: item ``[marker_t, x] -> 30 + (x + 7 t) mod 30``.
A LoRA backbone is trained on tasks 1 and 2; training it further on task 0 alone (the target) gives the direction,
which pulls every marker towards task 0's answers. The plain step and the step protected on tasks 1 and 2, at the
same trust, are scored by the test's own forward pass (the written dense updates added by its own hooks).
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch
from conftest import TARGETS, TINY_DECODER

MARKERS = (90, 91, 92)
XS = range(30)


def _answer(t: int, x: int) -> int:
    return 30 + (x + 7 * t) % 30


def _batch(tasks) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.tensor([[MARKERS[t], x, _answer(t, x)] for t in tasks for x in XS])
    labels = ids.clone()
    labels[:, :2] = -100
    return ids, labels


def _train(model, tasks, steps: int, lr: float) -> None:
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    ids, labels = _batch(tasks)
    model.train()
    for _ in range(steps):
        model(input_ids=ids, labels=labels).loss.backward()
        opt.step()
        opt.zero_grad()
    model.eval()


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """``(root, base)``: a tiny Qwen3 base (its output head scaled x25, so that a normed hidden state can reach
    confident logits), adapters bb (tasks 1 and 2) and t0 (bb trained further on task 0), one prompt file per task."""
    import transformers as tf
    from peft import LoraConfig, get_peft_model

    root = tmp_path_factory.mktemp("protect_trained")
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        base = tf.Qwen3ForCausalLM(tf.Qwen3Config(**TINY_DECODER))
        base.lm_head.weight.data *= 25
        base.save_pretrained(root / "base")
        model = get_peft_model(base, LoraConfig(r=8, lora_alpha=16, target_modules=list(TARGETS)))
        _train(model, (1, 2), 100, 1e-2)
        model.save_pretrained(root / "bb")
        _train(model, (0,), 30, 3e-3)
        model.save_pretrained(root / "t0")
    for t in range(3):
        (root / f"task{t}.jsonl").write_text("".join(
            json.dumps({"id": x, "prompt_ids": [MARKERS[t], x], "target_ids": [_answer(t, x)], "task": f"t{t}"}) + "\n"
            for x in XS))
    return root, root / "base"


def _loglik(base: Path, updates: dict) -> list[float]:
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
            ids, _ = _batch((t,))
            logp = torch.log_softmax(model(input_ids=ids).logits[:, 1], -1)
            out.append(float(logp[torch.arange(len(ids)), ids[:, 2]].mean()))
    for h in hs:
        h.remove()
    return out


@pytest.mark.slow
def test_the_protected_step_lowers_a_protected_task_less_than_the_plain_step(trained, run_cli, dense_updates,
                                                                              monkeypatch):
    """At the same trust, the plain step costs tasks 1 and 2 log-likelihood; the protected step costs them less."""
    root, base = trained
    monkeypatch.chdir(root)
    plain = run_cli("project", "--base", "bb", "--dir", "t0 - bb", "--alpha", "1", "--out", "plain", "--json",
                    "--force")
    assert plain.exit_code == 0, plain.output
    trust = json.loads(plain.output)["outputs"][0]["realized"]["global"]
    res = run_cli("project", "--base", "bb", "--dir", "t0 - bb", "--trust", trust, "--protect", "p1=task1.jsonl",
                  "--protect", "p2=task2.jsonl", "--target", "t0=task0.jsonl", "--base-model", base,
                  "--protect-energy", "0.9", "--out", "prot", "--json", "--force")
    assert res.exit_code == 0, res.output
    rep = json.loads(res.output)["outputs"][0]
    assert rep["realized"]["global"] == pytest.approx(trust, rel=1e-9)
    before = _loglik(base, dense_updates(root / "bb"))
    after_plain = _loglik(base, dense_updates(root / "plain"))
    after_prot = _loglik(base, dense_updates(root / "prot"))
    drop_plain = [before[t] - after_plain[t] for t in (1, 2)]
    drop_prot = [before[t] - after_prot[t] for t in (1, 2)]
    # measured: before (-10.11, -0.0049, -0.0047), plain (-0.074, -5.65, -6.52), protected (-5.14, -1.09, -0.56)
    assert after_plain[0] > before[0] and after_prot[0] > before[0]  # the direction raises the target
    assert min(drop_plain) > 0.05, (before, after_plain)  # ... and costs the protected tasks
    for t in range(2):
        assert drop_prot[t] < drop_plain[t], (drop_prot, drop_plain)
    assert rep["protection"]["protect"]["p1"]["kept_drift"] < 0.5
