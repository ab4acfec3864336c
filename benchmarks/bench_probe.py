"""``make bench``: ``vecmerge probe`` against a bare forward pass and a naive PEFT loop, side by side.

A random Qwen3 with Qwen3-0.6B layer shapes (hidden 1024, MLP 3072, 16 heads of 128, 8 KV heads; ``--layers`` of
its 28, a ``--vocab`` of its 151,936), ``--adapters`` random LoRA adapters of rank ``--rank`` on q/k/v/o/gate/up/down
of every layer, and ``--prompts`` items of ``--prompt-tokens`` + ``--target-tokens`` tokens. Measured in one
process, one after the other, on the same batches (``--batch`` items, longest first, as the probe batches them):

    bare         the base loaded once, then one plain forward pass over every batch per adapter (no adapter
                 applied: the floor of any probe)
    probe        ``vecmerge.probe.runner.run_probe`` (nothing recorded): the base loaded once, every adapter read,
                 hooked and run on every batch, scores and, with pairs, KL/JS between every pair
    probe, no pairs   the same without the divergences
    naive        per adapter, the base loaded and ``PeftModel.from_pretrained`` on it, a forward pass per batch,
                 the target log-likelihoods (what a script without vecmerge does)
    naive, one base   the same with the base loaded once and each adapter unloaded after use

Every time includes loading the base (once, or once per adapter for ``naive``); the ratios are to ``bare`` and to
``probe``. The runs go round-robin ``--repeat`` times and each keeps its best wall time (with the process CPU time
of that run): on a shared machine a run's wall time follows the load, which changes within minutes. ``--threads``
(default 1) sets torch's threads: one thread is the least disturbed by other processes on a small shared machine.
The probe's log-likelihoods are checked against the naive loop's (largest relative difference shown).
Progress goes to stderr; the table to stdout and ``OUT/probe.md`` (raw figures: ``OUT/probe.json``).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import warnings
from pathlib import Path

import torch

QWEN3_06B = dict(hidden_size=1024, intermediate_size=3072, num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                 max_position_embeddings=4096, tie_word_embeddings=True, rope_theta=1_000_000.0)
TINY = dict(hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            max_position_embeddings=256, tie_word_embeddings=True)
T0 = time.perf_counter()


def log(msg: str) -> None:
    print(f"[probe bench {time.perf_counter() - T0:6.1f}s] {msg}", file=sys.stderr, flush=True)


def make_data(root: Path, a) -> tuple[Path, list[Path], Path]:
    """The random base, the adapters and the prompt file under ``root`` (seeded)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from vecmerge.testing import toy_adapter

    root.mkdir(parents=True, exist_ok=True)
    base = root / "base"
    config = Qwen3Config(vocab_size=a.vocab, num_hidden_layers=a.layers, **(TINY if a.tiny else QWEN3_06B))
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        Qwen3ForCausalLM(config).save_pretrained(base)
    adapters = [toy_adapter(root / f"a{i:02d}", config=config, rank=a.rank, seed=100 + i, base_model=str(base))
                for i in range(a.adapters)]
    g = torch.Generator().manual_seed(1)
    prompts = root / "prompts.jsonl"
    with open(prompts, "w") as f:
        for i in range(a.prompts):
            ids = torch.randint(0, a.vocab, (a.prompt_tokens + a.target_tokens,), generator=g).tolist()
            f.write(json.dumps({"id": f"p{i}", "prompt_ids": ids[:a.prompt_tokens],
                                "target_ids": ids[a.prompt_tokens:]}) + "\n")
    return base, adapters, prompts


def batches(prompt_set, size: int, device):
    """The probe's own batching (longest first), as tensors: ids, attention mask, target mask, targets."""
    # a building block measured on its own (internal, private): the probe runner's batching
    from vecmerge.probe.runner import _batch_tensors

    items = sorted(prompt_set.items, key=lambda it: (-it.length, it.line))
    return [_batch_tensors(items[i:i + size], device) for i in range(0, len(items), size)]


def loglik(logits, keep, targets) -> torch.Tensor:
    lp = torch.log_softmax(logits[keep].double(), -1)
    return lp.gather(1, targets[:, None]).squeeze(1)


def load(base, device):
    from transformers import AutoModelForCausalLM

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32).to(device).eval()


def bare(base, adapters, data, device) -> None:
    model = load(base, device)
    with torch.inference_mode():
        for _ in adapters:
            for ids, att, *_ in data:
                _ = model(input_ids=ids, attention_mask=att, use_cache=False).logits


def probe(base, adapters, prompt_set, a, device, pairs: bool) -> dict:
    from vecmerge import Adapter

    # the building block measured (internal): the probe runner without the CLI's ledger and report
    from vecmerge.probe.runner import ProbeModel, run_probe

    models = [ProbeModel(f.name, Adapter(f), None) for f in adapters]
    return run_probe(base, models, prompt_set, batch=a.batch, pairs=pairs, device=device).models


def naive(base, adapters, data, device, once: bool) -> dict:
    from peft import PeftModel

    out, model = {}, load(base, device) if once else None
    for folder in adapters:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            peft_model = PeftModel.from_pretrained(model if once else load(base, device), str(folder)).eval()
        with torch.inference_mode():
            out[folder.name] = torch.cat([loglik(peft_model(input_ids=ids, attention_mask=att, use_cache=False).logits,
                                                 keep, targets) for ids, att, keep, targets, _ in data])
        if once:
            model = peft_model.unload()
    return out


def timed(fn) -> tuple[float, float, object]:
    """(wall seconds, process CPU seconds, result) of ``fn()``; a CUDA device is synchronized around it."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter() - wall, time.process_time() - cpu, out


def worst_gap(models: dict, naive_rows: dict, prompt_set, data) -> float:
    """Largest relative difference of an item's loglik between the probe and the naive loop."""
    items = sorted(prompt_set.items, key=lambda it: (-it.length, it.line))
    worst = 0.0
    for name, rows in naive_rows.items():
        at = 0
        for it in items:
            t = len(it.target_ids)
            ref = float(rows[at:at + t].sum())
            at += t
            worst = max(worst, abs(models[name]["items"][it.id]["loglik"] - ref) / abs(ref))
    return worst


NAMES = {"bare": "bare forward (floor)", "probe": "probe (pairs)", "probe_no_pairs": "probe (no pairs)",
         "naive": "naive: base + PeftModel.from_pretrained per adapter",
         "naive_once": "naive, one base (unload after each)"}


def render(res: dict) -> str:
    s, cpu, c = res["seconds"], res["cpu_seconds"], res["config"]
    head = (f"probe: {c['adapters']} adapters (r={c['rank']}) x {c['prompts']} prompts of {c['prompt_tokens']} + "
            f"{c['target_tokens']} tokens, batch {c['batch']}, {'tiny' if c['tiny'] else 'Qwen3-0.6B'} layer shapes, "
            f"{c['layers']} layers, vocab {c['vocab']}, {c['device']}, {c['threads']} thread(s); load average before "
            f"{res['load_before']}, after {res['load_after']}")
    lines = [head, "", f"| run | best wall s (of {c['repeat']}) | CPU s of that run | / bare | / probe |",
             "|---|---|---|---|---|"]
    lines += [f"| {NAMES[k]} | {s[k]:.2f} | {cpu[k]:.2f} | {s[k] / s['bare']:.2f}x | {s[k] / s['probe']:.2f}x |"
              for k in NAMES if k in s]
    lines.append(f"\nevery wall time (s), in order: "
                 f"{json.dumps({k: [round(x, 2) for x in v] for k, v in res['walls'].items()})}")
    if res.get("worst_gap") is not None:
        lines.append(f"probe vs naive PEFT log-likelihoods: largest relative difference {res['worst_gap']:.2e}")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("bench-out/probe"))
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--adapters", type=int, default=13)
    p.add_argument("--rank", type=int, default=32)
    p.add_argument("--prompts", type=int, default=64)
    p.add_argument("--prompt-tokens", type=int, default=16)
    p.add_argument("--target-tokens", type=int, default=16)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=1, help="torch threads on the CPU (default 1).")
    p.add_argument("--repeat", type=int, default=2, help="Round-robin rounds; each run keeps its best wall time.")
    p.add_argument("--no-naive", action="store_true", help="Skip the two naive PEFT loops.")
    p.add_argument("--tiny", action="store_true", help="A tiny model (a smoke run of the script).")
    a = p.parse_args(argv)
    from transformers.utils import logging as hf_logging

    # building blocks (internal): the --device rule and the prompt-file reader the runner takes
    from vecmerge.linalg.lowrank import resolve_device
    from vecmerge.probe.prompts import read_prompts

    hf_logging.disable_progress_bar()
    device = resolve_device(a.device)
    torch.set_num_threads(a.threads)

    def uptime() -> str:
        return subprocess.run(["uptime"], capture_output=True, text=True).stdout.split("load average:")[-1].strip()

    res = {"config": {**{k: v for k, v in vars(a).items() if k != "out"}, "device": str(device),
                      "threads": torch.get_num_threads()}, "load_before": uptime(), "seconds": {}, "cpu_seconds": {},
           "walls": {}}
    log("writing the base, the adapters and the prompts")
    base, adapters, prompts = make_data(a.out / "data", a)
    prompt_set = read_prompts(prompts)
    data = batches(prompt_set, a.batch, device)
    runs = {"bare": lambda: bare(base, adapters, data, device),
            "probe": lambda: probe(base, adapters, prompt_set, a, device, pairs=True),
            "probe_no_pairs": lambda: probe(base, adapters, prompt_set, a, device, pairs=False)}
    if not a.no_naive:
        runs["naive"] = lambda: naive(base, adapters, data, device, once=False)
        runs["naive_once"] = lambda: naive(base, adapters, data, device, once=True)
    outputs = {}
    for r in range(a.repeat):
        for name, fn in runs.items():
            log(f"round {r + 1}/{a.repeat}: {NAMES[name]}")
            wall, cpu, outputs[name] = timed(fn)
            res["walls"].setdefault(name, []).append(wall)
            if wall <= min(res["walls"][name]):
                res["seconds"][name], res["cpu_seconds"][name] = wall, cpu
    if not a.no_naive:
        res["worst_gap"] = worst_gap(outputs["probe"], outputs["naive"], prompt_set, data)
    res["load_after"] = uptime()
    text = render(res)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "probe.md").write_text(text + "\n")
    (a.out / "probe.json").write_text(json.dumps(res, indent=2))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
