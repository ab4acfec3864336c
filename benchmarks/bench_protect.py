"""``make bench``: a protected step's capture (``probe.capture.capture_grams``) against a bare forward pass.

A random model with Qwen3-0.6B layer shapes (hidden 1024, MLP 3072) or Llama-3-8B layer shapes (hidden 4096, MLP
14336), ``--layers`` layers, a small vocabulary, a random rank-``--rank`` backbone on q/k/v/o/gate/up/down as hooks,
and ``--prompts`` items of ``--tokens`` tokens in batches of ``--batch``. Measured one after the other, round-robin
``--repeat`` times (each keeps its best wall time), on the CPU with ``--threads`` torch threads:

    bare       the forward passes with the backbone's hooks on (what capturing must run anyway)
    capture    the same passes with the Gram hooks: ``G += X^T X`` in float64 per distinct module input

and the Grams' memory (one ``in x in`` float64 matrix per distinct input: q/k/v share one, gate/up share one).
The table goes to stdout and ``OUT/protect.md`` (raw figures: ``OUT/protect.json``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

SHAPES = {
    "qwen3-0.6b": ("Qwen3Config", "Qwen3ForCausalLM",
                   dict(hidden_size=1024, intermediate_size=3072, num_attention_heads=16, num_key_value_heads=8,
                        head_dim=128)),
    "llama-3-8b": ("LlamaConfig", "LlamaForCausalLM",
                   dict(hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8,
                        head_dim=128)),
}
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def setup(a):
    import transformers

    # building blocks (internal): the backbone's hook factors and an in-memory prompt set
    from vecmerge.probe.hooks import Update
    from vecmerge.probe.prompts import Item, PromptSet

    cfg_name, model_name, shape = SHAPES[a.shape]
    torch.manual_seed(0)
    cfg = getattr(transformers, cfg_name)(vocab_size=a.vocab, num_hidden_layers=a.layers, max_position_embeddings=4096,
                                          **shape)
    model = getattr(transformers, model_name)(cfg).eval()
    modules = [n for n, m in model.named_modules() if n.split(".")[-1] in TARGETS]
    g = torch.Generator().manual_seed(1)
    backbone = {}
    for n in modules:
        w = model.get_submodule(n).weight
        backbone[n] = Update("linear", torch.randn(a.rank, w.shape[1], generator=g) * 0.01,
                             torch.randn(w.shape[0], a.rank, generator=g) * 0.01, 1.0)
    items = tuple(Item(f"p{i}", tuple(torch.randint(0, a.vocab, (a.tokens - 1,), generator=g).tolist()),
                       (int(torch.randint(0, a.vocab, (1,), generator=g)),), line=i + 1) for i in range(a.prompts))
    return model, modules, backbone, PromptSet(Path("bench.jsonl"), "0" * 64, items, "bench")


def bare(model, modules, backbone, ps, batch):
    # building blocks (internal): the probe's hooks and batching, as the capture uses them
    from vecmerge.probe.hooks import LoraHooks
    from vecmerge.probe.runner import _batch_tensors

    items = sorted(ps.items, key=lambda it: (-it.length, it.line))
    with LoraHooks(model, modules) as hooks, torch.inference_mode():
        hooks.use(backbone)
        for i in range(0, len(items), batch):
            ids, att, *_ = _batch_tensors(items[i:i + batch], "cpu")
            model(input_ids=ids, attention_mask=att, use_cache=False)


def capture(model, modules, backbone, ps, batch):
    # building block (internal): the protected step's capture, timed apart
    from vecmerge.probe.capture import capture_grams

    return capture_grams(model, backbone, {"s": ps}, modules, batch=batch)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("bench-out/protect"))
    p.add_argument("--shape", choices=sorted(SHAPES), nargs="+", default=["qwen3-0.6b", "llama-3-8b"])
    p.add_argument("--layers", type=int, default=1)
    p.add_argument("--vocab", type=int, default=2048)
    p.add_argument("--rank", type=int, default=32)
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeat", type=int, default=2)
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    rows, raw = [], {}
    for shape in a.shape:
        a.shape = shape
        model, modules, backbone, ps = setup(a)
        walls: dict = {"bare": [], "capture": []}
        grams = None
        for _ in range(a.repeat):
            for name, fn in (("bare", bare), ("capture", capture)):
                t = time.perf_counter()
                out = fn(model, modules, backbone, ps, a.batch)
                walls[name].append(time.perf_counter() - t)
                grams = out if name == "capture" else grams
        unique = {id(g): g for g in grams.by_set["s"].values()}
        mem = sum(g.numel() * g.element_size() for g in unique.values())
        best = {k: min(v) for k, v in walls.items()}
        raw[shape] = {"walls": walls, "best": best, "gram_bytes": mem, "distinct_inputs": len(unique),
                      "modules": len(modules), "rows": a.prompts * a.tokens}
        rows.append(f"| {shape} | {a.layers} | {len(modules)} | {len(unique)} | {a.prompts * a.tokens} | "
                    f"{best['bare']:.2f} | {best['capture']:.2f} | {best['capture'] / best['bare']:.2f}x | "
                    f"{mem / 2 ** 20:.0f} MiB |")
        print(f"[protect bench] {shape}: {rows[-1]}", file=sys.stderr, flush=True)
    head = (f"protected-step capture on the CPU ({a.threads} thread(s)), {a.prompts} prompts x {a.tokens} tokens, "
            f"batch {a.batch}, backbone rank {a.rank}, vocab {a.vocab}; best of {a.repeat}")
    table = "\n".join([head, "", "| layer shapes | layers | modules | distinct inputs (Grams) | rows | bare forward s "
                       "| capture s | capture / bare | Gram memory |", "|---|---|---|---|---|---|---|---|---|", *rows])
    print(table)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "protect.md").write_text(table + "\n")
    (a.out / "protect.json").write_text(json.dumps(raw, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
