"""``make bench``: candidates evaluated per minute by ``vecmerge search`` against the mergekit-evolve way.

A random Qwen3 of Qwen3-0.6B layer shapes (hidden 1024, MLP 3072, 16 heads of 128, 8 KV heads, tied embeddings,
its vocabulary of 151,936 by default) with ``--layers`` of its 28 layers (a comma list: one measurement per count);
a backbone and a second adapter of rank ``--rank`` on q/k/v/o/gate/up/down; a target and a protected prompt set of
``--prompts`` items of ``--tokens`` + 1 tokens. The same ``--candidates`` grid candidates (trust and protection
energy: each built with its projection) scored on both sets, in one process, side by side:

    vecmerge   ``search.engine.prepare`` once (base loaded, protected inputs captured and decomposed, backbone
               scored: shown apart as setup), then per candidate ``candidate.build`` (exact factors) and the
               hooked forward passes of ``evaluate.Scorer``; nothing written
    evolve     per candidate what mergekit-evolve does: the dense merged weights ``W + B A`` formed for every
               module, the model written with ``save_pretrained`` (safetensors), loaded again from disk, the same
               prompts scored by the same ``Scorer`` (no hooks); the base kept in memory between candidates (kinder
               than mergekit, which reads its inputs again for each merge)

The ways alternate ``--repeat`` rounds; each keeps its best wall and its best process CPU seconds per candidate.
With two or more layer counts, each way's seconds per candidate are fitted as ``a + b * layers`` (both ways are
affine in the layer count at a fixed vocabulary and prompts) and taken to 28 layers: an estimate, marked so. Both
ways' log-likelihoods are compared (largest difference shown). ``--threads`` (default 1) sets torch's threads.
The table goes to stdout and ``OUT/search.md`` (raw figures: ``OUT/search.json``); progress to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

QWEN3_06B = dict(
    hidden_size=1024,
    intermediate_size=3072,
    num_attention_heads=16,
    num_key_value_heads=8,
    head_dim=128,
    max_position_embeddings=4096,
    tie_word_embeddings=True,
    rope_theta=1_000_000.0,
)
TINY = dict(
    hidden_size=64,
    intermediate_size=96,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=256,
    tie_word_embeddings=True,
)
FULL_LAYERS = 28
T0 = time.perf_counter()


def log(msg: str) -> None:
    print(f"[search bench {time.perf_counter() - T0:6.1f}s] {msg}", file=sys.stderr, flush=True)


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def make_data(root: Path, layers: int, a) -> None:
    """Into ``root``: the random base, adapters ``bb`` and ``t0`` of its shapes, ``target.jsonl`` and
    ``protect.jsonl`` (seeded)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from vecmerge.testing import toy_adapter

    config = Qwen3Config(vocab_size=a.vocab, num_hidden_layers=layers, **(TINY if a.tiny else QWEN3_06B))
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        Qwen3ForCausalLM(config).save_pretrained(root / "base")
    toy_adapter(root / "bb", config=config, rank=a.rank, seed=1)
    toy_adapter(root / "t0", config=config, rank=a.rank, seed=2)
    gen = torch.Generator().manual_seed(0)
    for name in ("target", "protect"):
        rows = [
            {
                "id": i,
                "prompt_ids": torch.randint(2, a.vocab, (a.tokens,), generator=gen).tolist(),
                "target_ids": torch.randint(2, a.vocab, (1,), generator=gen).tolist(),
            }
            for i in range(a.prompts)
        ]
        (root / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def prepare(root: Path, a):
    """``engine.prepare`` on the data (nothing recorded): the base loaded, the Grams captured, the backbone scored."""
    from vecmerge import Workspace

    # building block: the search's setup, timed apart from its candidates
    from vecmerge.search import engine

    return engine.prepare(
        Workspace(root=root),
        base="bb",
        dirs=["t0 - bb"],
        target={"target": str(root / "target.jsonl")},
        protect={"protect": str(root / "protect.jsonl")},
        margin=1.0,
        trust_max=0.05,
        base_model=root / "base",
        batch=a.batch,
    )


def ours(setup, cands: list) -> list:
    """vecmerge's way: per candidate its exact factors built and its hooks run on both sets."""
    # building block: a candidate's exact factors for the hooks
    from vecmerge.search.candidate import build

    return [setup.scorer.scores(build(c, setup.factors).updates) for c in cands]


class Evolve:
    """The mergekit-evolve way (module docstring): the base held once, each candidate merged, written, loaded, run."""

    def __init__(self, setup, root: Path, a):
        # building block: the base loaded as probe loads it
        from vecmerge.probe.runner import load_base

        self.setup, self.batch, self.dir = setup, a.batch, Path(tempfile.mkdtemp(prefix="evolve-", dir=root))
        self.base = load_base(root / "base", torch.device("cpu"))
        self.original = {m: self.base.get_submodule(m).weight.detach().clone() for m in setup.factors.modules}

    def __call__(self, cands: list) -> list:
        from transformers import AutoModelForCausalLM

        # building blocks: quiet loading, a candidate's dense update, the same scoring
        from vecmerge.probe.quiet import quiet_libraries
        from vecmerge.search.candidate import dense
        from vecmerge.search.evaluate import Scorer

        out = []
        for c in cands:
            with torch.no_grad():
                for m, delta in dense(c, self.setup.factors).items():
                    self.base.get_submodule(m).weight.copy_(self.original[m] + delta.to(torch.float32))
            folder = self.dir / "merged"
            self.base.save_pretrained(folder)
            with quiet_libraries():
                merged = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
            scorer = Scorer(merged, [], self.setup.sets, batch=self.batch)
            out.append(scorer.scores({}))
            scorer.close()
            del merged
            shutil.rmtree(folder)
        with torch.no_grad():
            for m, w in self.original.items():
                self.base.get_submodule(m).weight.copy_(w)
        return out

    def close(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


def timed(fn, *args):
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn(*args)
    return time.perf_counter() - wall, time.process_time() - cpu, out


def measure(layers: int, a) -> dict:
    """One layer count: setup, then the ways alternating ``a.repeat`` rounds; per candidate seconds (best round)."""
    # building blocks: the candidates both ways score and their recipes
    from vecmerge.search.candidate import build
    from vecmerge.search.optimize import grid
    from vecmerge.search.space import candidate

    with tempfile.TemporaryDirectory(prefix="bench-search-") as d:
        root = Path(d)
        log(f"{layers} layer(s): writing the base, the adapters and the prompts")
        make_data(root, layers, a)
        log(f"{layers} layer(s): vecmerge setup (load, capture, backbone)")
        setup_wall, setup_cpu, setup = timed(prepare, root, a)
        cands = [candidate(setup.space, p) for p in grid(setup.space, a.candidates, 0)]
        log(f"{layers} layer(s): each candidate built once, untimed (a warm-up for both ways)")
        warmup_wall, _, _ = timed(lambda: [build(c, setup.factors) for c in cands])
        evolve = Evolve(setup, root, a)
        runs = {"vecmerge": lambda: ours(setup, cands), "evolve": lambda: evolve(cands)}
        res: dict = {
            "layers": layers,
            "setup_s": setup_wall,
            "setup_cpu_s": setup_cpu,
            "warmup_s": warmup_wall,
            "wall": {},
            "cpu": {},
            "rounds": {},
            "energies": sorted({c.params.get("energy", 0.0) for c in cands}),
        }
        scores = {}
        for r in range(a.repeat):
            for name, fn in runs.items():
                log(f"{layers} layer(s), round {r + 1}/{a.repeat}: {name}, {len(cands)} candidates")
                wall, cpu, scores[name] = timed(fn)
                res["rounds"].setdefault(name, []).append([wall / len(cands), cpu / len(cands)])
                res["wall"][name] = min(x[0] for x in res["rounds"][name])
                res["cpu"][name] = min(x[1] for x in res["rounds"][name])
        evolve.close()
        setup.scorer.close()
    res["max_abs_diff"] = max(
        abs(x[s][i]["loglik"] - y[s][i]["loglik"])
        for x, y in zip(scores["vecmerge"], scores["evolve"])
        for s in x
        for i in x[s]
    )
    res["max_abs_loglik"] = max(abs(v["loglik"]) for x in scores["evolve"] for s in x for v in x[s].values())
    return res


def fit(points: list[tuple[int, float]]) -> tuple[float, float]:
    """Least squares ``(a, b)`` of ``seconds = a + b * layers``."""
    n = len(points)
    mx, my = sum(p[0] for p in points) / n, sum(p[1] for p in points) / n
    b = sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x, _ in points)
    return my - b * mx, b


def render(res: dict) -> str:
    a = res["config"]
    shape = "tiny (hidden 64)" if a["tiny"] else "Qwen3-0.6B layer shapes (hidden 1024, MLP 3072, 16 x 128 heads)"
    lines = [
        f"search bench: {shape}, vocabulary {a['vocab']}, rank {a['rank']}, {a['prompts']} target + "
        f"{a['prompts']} protected items of {a['tokens']} + 1 tokens, batch {a['batch']}, {a['candidates']} "
        f"candidates, best of {a['repeat']} rounds, {res['threads']} torch thread(s), CPU; load average "
        f"{res['load_before']} before, {res['load_after']} after",
        "",
        "| layers | way | wall s per candidate | CPU s per candidate | per minute (wall) | per hour on one core "
        "(CPU) | vecmerge faster (wall / CPU) |",
        "|---|---|---|---|---|---|---|",
    ]
    for m in res["runs"]:
        w, c = m["wall"], m["cpu"]
        for way, label in (
            ("vecmerge", "vecmerge (hooks, nothing written)"),
            ("evolve", "evolve way (merge, save, load, run)"),
        ):
            ratio = (
                f"**{w['evolve'] / w['vecmerge']:.2f}x / {c['evolve'] / c['vecmerge']:.2f}x**"
                if way == "vecmerge"
                else ""
            )
            lines.append(
                f"| {m['layers']} | {label} | {w[way]:.3f} | {c[way]:.3f} | {60 / w[way]:.1f} | "
                f"{3600 / c[way]:.0f} | {ratio} |"
            )
    lines += [
        "",
        "setup once per search (vecmerge): "
        + "; ".join(
            f"{m['layers']} layers {m['setup_s']:.1f} s (load, capture and decompositions, backbone scored)"
            for m in res["runs"]
        ),
    ]
    if "at_full" in res:
        w, c = res["at_full"]["wall"], res["at_full"]["cpu"]
        where = "this shape" if a["tiny"] else "the whole Qwen3-0.6B"
        lines += [
            "",
            f"estimate at {FULL_LAYERS} layers ({where}; each way fitted as a + b * layers on the counts "
            f"above, an extrapolation): CPU s per candidate vecmerge {c['vecmerge']:.2f} "
            f"({3600 / c['vecmerge']:.0f} per hour on one core), evolve way {c['evolve']:.2f} "
            f"({3600 / c['evolve']:.0f} per hour): {c['evolve'] / c['vecmerge']:.2f}x; from the wall times "
            f"{w['evolve'] / w['vecmerge']:.2f}x",
        ]
    worst = max(m["max_abs_diff"] / max(1.0, m["max_abs_loglik"]) for m in res["runs"])
    lines += [
        "",
        f"the ways agree: largest loglik difference {worst:.2g} relative (float32 hooks against float32 "
        "merged weights)",
    ]
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("bench-out/search"))
    p.add_argument("--layers", default="2,4", help="Comma list of layer counts (of Qwen3-0.6B's 28).")
    p.add_argument("--vocab", type=int, default=151936)
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--prompts", type=int, default=16, help="Items per set (target and protected).")
    p.add_argument("--tokens", type=int, default=32, help="Prompt tokens per item (one target token).")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--candidates", type=int, default=4)
    p.add_argument("--repeat", type=int, default=3, help="Rounds, the ways alternating; each keeps its best.")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1: one CPU core).")
    p.add_argument("--tiny", action="store_true", help="A hidden-64 model, vocabulary 512: a smoke run.")
    a = p.parse_args(argv)
    if a.tiny:
        a.vocab = min(a.vocab, 512)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    torch.set_num_threads(a.threads)
    counts = [int(x) for x in a.layers.split(",")]
    res: dict = {
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items()},
        "threads": torch.get_num_threads(),
        "load_before": load_average(),
        "runs": [],
    }
    for layers in counts:
        res["runs"].append(measure(layers, a))
    if len(set(counts)) > 1:
        res["at_full"] = {}
        for way in ("vecmerge", "evolve"):
            for kind in ("wall", "cpu"):
                base, slope = fit([(m["layers"], m[kind][way]) for m in res["runs"]])
                res["at_full"].setdefault(kind, {})[way] = base + slope * FULL_LAYERS
    res["load_after"] = load_average()
    text = render(res)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "search.md").write_text(text + "\n")
    (a.out / "search.json").write_text(json.dumps(res, indent=2))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
