"""The protected-step frontier on a tiny model trained here on three tasks: target gain against protected drop.

Three tasks share one input ``x`` and disagree on the answer (``[marker_t, x] -> 30 + (x + 7 t) mod 30``). A LoRA
backbone ``bb`` learns tasks 1 and 2; trained further on task 0 alone it becomes ``t0``, so the direction
``t0 - bb`` raises task 0 and pulls the other markers toward task 0's answers. For each trust (a share of the
backbone's norm) the plain step and the step protected on tasks 1 and 2 at each energy E are written by
``vecmerge.pipeline.run`` and probed per task by ``vecmerge.probe`` (mean target log-likelihood per item). The
table goes to stdout and ``OUT/frontier.md`` (raw: ``OUT/frontier.json``), the plot to ``OUT/frontier.png``;
``tests/pipeline/test_protection_trained.py`` holds the same set-up as a test.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path

import torch

MARKERS = (90, 91, 92)
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
TINY = dict(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=8, max_position_embeddings=64, tie_word_embeddings=False)


def _batch(tasks):
    ids = torch.tensor([[MARKERS[t], x, 30 + (x + 7 * t) % 30] for t in tasks for x in range(30)])
    labels = ids.clone()
    labels[:, :2] = -100
    return ids, labels


def _train(model, tasks, steps, lr):
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    ids, labels = _batch(tasks)
    model.train()
    for _ in range(steps):
        model(input_ids=ids, labels=labels).loss.backward()
        opt.step()
        opt.zero_grad()
    model.eval()


def make(root: Path) -> None:
    import transformers as tf
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        base = tf.Qwen3ForCausalLM(tf.Qwen3Config(**TINY))
        base.lm_head.weight.data *= 25  # a normed hidden state can reach confident logits
        base.save_pretrained(root / "base")
        model = get_peft_model(base, LoraConfig(r=8, lora_alpha=16, target_modules=TARGETS))
        _train(model, (1, 2), 100, 1e-2)
        model.save_pretrained(root / "bb")
        _train(model, (0,), 30, 3e-3)
        model.save_pretrained(root / "t0")
    rows = [{"id": f"{t}-{x}", "prompt_ids": [MARKERS[t], x], "target_ids": [30 + (x + 7 * t) % 30], "task": f"t{t}"}
            for t in range(3) for x in range(30)]
    (root / "all.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    for t in range(3):
        (root / f"task{t}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows if r["task"] == f"t{t}"))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("bench-out/frontier"))
    p.add_argument("--trust", type=float, nargs="+", default=[0.05, 0.1, 0.2, 0.4, 0.8])
    p.add_argument("--energy", type=float, nargs="+", default=[0.5, 0.9, 0.99])
    a = p.parse_args(argv)
    from vecmerge import Adapter, Recipe, Workspace, run

    # building blocks (internal): the probe runner and its prompt reader, per task
    from vecmerge.probe.prompts import read_prompts
    from vecmerge.probe.runner import ProbeModel, run_probe

    root = a.out.resolve()
    root.mkdir(parents=True, exist_ok=True)
    if not (root / "t0").is_dir():
        make(root)
    (root / "vecmerge.yaml").write_text(f"adapters:\n  bb: {root / 'bb'}\n  t0: {root / 't0'}\n")
    ws = Workspace(root / "vecmerge.yaml")
    outs = []
    for T in a.trust:
        rec = {"base": "bb", "dir": "t0 - bb", "trust": T}
        plain = root / f"plain-t{T:g}"
        run(Recipe.from_dict({**rec, "out": str(plain)}), ws, force=True)
        outs.append((T, None, plain, None))
        prot = Recipe.from_dict({**rec, "out": str(root / f"prot-t{T:g}"), "base_model": str(root / "base"),
                                 "protect": {"t1": str(root / "task1.jsonl"), "t2": str(root / "task2.jsonl")},
                                 "target": {"t0": str(root / "task0.jsonl")}, "protect_energy": a.energy})
        rep = run(prot, ws, force=True)
        for o in rep.outputs:
            outs.append((T, o.protection["energy"], Path(o.path), o.protection))
    models = [ProbeModel("bb", Adapter(root / "bb"), None)] + [
        ProbeModel(f"{'plain' if e is None else f'E{e:g}'}-t{T:g}", Adapter(path), None) for T, e, path, _ in outs]
    res = run_probe(root / "base", models, read_prompts(root / "all.jsonl"), pairs=False)
    lines = ["| trust | step | target t0 gain | protected drop t1 | protected drop t2 | kept_drift t1 / t2 | "
             "kept_change t0 | kept_direction |", "|---|---|---|---|---|---|---|---|"]
    raw = []
    for (T, e, _, prot), m in zip(outs, models[1:]):
        ch = res.models[m.name]["summary"]["changes"]["tasks"]
        row = {"trust": T, "energy": e, "gain_t0": ch["t0"]["change"], "drop_t1": -ch["t1"]["change"],
               "drop_t2": -ch["t2"]["change"]}
        kept = "-" if prot is None else (f"{prot['protect']['t1']['kept_drift']:.3f} / "
                                         f"{prot['protect']['t2']['kept_drift']:.3f}")
        lines.append(f"| {T:g} | {'plain' if e is None else f'protected E {e:g}'} | {row['gain_t0']:+.3f} | "
                     f"{row['drop_t1']:+.3f} | {row['drop_t2']:+.3f} | {kept} | "
                     f"{'-' if prot is None else format(prot['target']['t0']['kept_change'], '.3f')} | "
                     f"{'-' if prot is None else format(prot['kept_direction'], '.3f')} |")
        raw.append({**row, "protection": prot})
    table = "\n".join(["mean target log-likelihood change per item from the backbone (30 items per task)", "",
                       *lines])
    print(table)
    (root / "frontier.md").write_text(table + "\n")
    (root / "frontier.json").write_text(json.dumps(raw, indent=1))
    # building block (internal): the frontier plot
    from vecmerge.report.protect import frontier_png

    frontier_png([{"trust": r["trust"], "energy": r["energy"], "gain": r["gain_t0"], "drops": [r["drop_t1"],
                  r["drop_t2"]]} for r in raw], root / "frontier.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
