"""``make bench``: a protected step's capture (``probe.capture.capture_grams``) against a bare forward pass.

A random model with Qwen3-0.6B layer shapes (hidden 1024, MLP 3072) or Llama-3-8B layer shapes (hidden 4096, MLP
14336), ``--layers`` layers, a small vocabulary, a random rank-``--rank`` backbone on q/k/v/o/gate/up/down as hooks,
and ``--prompts`` items of ``--tokens`` tokens in batches of ``--batch``. Measured one after the other, round-robin
``--repeat`` times (each keeps its best wall time), on the CPU with ``--threads`` torch threads:

    bare       the forward passes with the backbone's hooks on (what capturing must run anyway)
    capture    the same passes with the capture's hooks (``probe/inputs.py``: rows kept while fewer than the
               width, an exact float64 Gram beyond, a Frequent Directions sketch for inputs wider than 4096)
    basis      after the forward: every module's U at E 0.9 (float64 SVD of kept rows, or eigh of a Gram)
    earlier    with ``--earlier``: the capture as it was (a float64 Gram ``G += X^T X`` from the first batch)

and the memory the captured inputs hold (q/k/v share one input, gate/up one).
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


def capture(model, modules, backbone, ps, batch, row_limit=None):
    # building block (internal): the protected step's capture, timed apart
    from vecmerge.probe.capture import capture_grams

    return capture_grams(model, backbone, {"s": ps}, modules, batch=batch, row_limit=row_limit)


def earlier(model, modules, backbone, ps, batch):
    return capture(model, modules, backbone, ps, batch, row_limit=0)


def basis(grams, modules) -> float:
    """Seconds to form every module's U at E 0.9 (shared inputs decomposed once)."""
    t = time.perf_counter()
    for m in modules:
        grams.basis(["s"], m, 0.9)
    return time.perf_counter() - t


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
    p.add_argument("--earlier", action="store_true", help="also time the earlier capture (a Gram from the start)")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    rows, raw = [], {}
    runs = [("bare", bare), ("capture", capture)] + ([("earlier", earlier)] if a.earlier else [])
    for shape in a.shape:
        a.shape = shape
        model, modules, backbone, ps = setup(a)
        walls: dict = {name: [] for name, _ in runs}
        held: dict = {}
        for _ in range(a.repeat):
            for name, fn in runs:
                t = time.perf_counter()
                out = fn(model, modules, backbone, ps, a.batch)
                walls[name].append(time.perf_counter() - t)
                held[name] = out
        best = {k: min(v) for k, v in walls.items()}
        grams = held["capture"]
        forms = sorted({i.kind for mods in grams.by_set.values() for i in mods.values()})
        raw[shape] = {"walls": walls, "best": best, "held_bytes": grams.nbytes(), "forms": forms,
                      "basis_s": basis(grams, modules), "distinct_inputs": len(grams.groups),
                      "modules": len(modules), "rows": a.prompts * a.tokens, "sketched": grams.sketched()}
        if a.earlier:
            raw[shape].update(earlier_bytes=held["earlier"].nbytes(), earlier_basis_s=basis(held["earlier"], modules))
        r = raw[shape]
        line = (f"| {shape} | {a.layers} | {r['distinct_inputs']} | {r['rows']} | {'/'.join(forms)} | "
                f"{best['bare']:.2f} | {best['capture']:.2f} | {best['capture'] / best['bare']:.2f}x | "
                f"{r['basis_s']:.2f} | {r['held_bytes'] / 2 ** 20:.0f} MiB |")
        if a.earlier:
            line += (f" {best['earlier']:.2f} ({best['earlier'] / best['bare']:.2f}x) | {r['earlier_basis_s']:.2f} | "
                     f"{r['earlier_bytes'] / 2 ** 20:.0f} MiB |")
        rows.append(line)
        print(f"[protect bench] {shape}: {rows[-1]}", file=sys.stderr, flush=True)
    head = (f"protected-step capture on the CPU ({a.threads} thread(s)), {a.prompts} prompts x {a.tokens} tokens, "
            f"batch {a.batch}, backbone rank {a.rank}, vocab {a.vocab}; best of {a.repeat}")
    cols = ("| layer shapes | layers | distinct inputs | rows | held as | bare forward s | capture s | capture / bare "
            "| basis s | held memory |")
    rule = "|---|---|---|---|---|---|---|---|---|---|"
    if a.earlier:
        cols += " earlier capture s | earlier basis s | earlier memory |"
        rule += "---|---|---|"
    table = "\n".join([head, "", cols, rule, *rows])
    print(table)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "protect.md").write_text(table + "\n")
    (a.out / "protect.json").write_text(json.dumps(raw, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
