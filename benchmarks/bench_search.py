"""``make bench``: candidates evaluated per minute by ``vecmerge search`` against the mergekit-evolve way.

A random Qwen3 with Qwen3-0.6B layer shapes (hidden 1024, MLP 3072, 16 heads of 128, 8 KV heads; ``--layers`` of its
28, a ``--vocab`` of its 151,936), a backbone and a second adapter of rank ``--rank`` on q/k/v/o/gate/up/down, one
target and one protected set of ``--prompts`` items of ``--tokens`` + 1 tokens. ``--candidates`` grid candidates
(trust and protection energy), each scored on both sets:

    vecmerge   ``search.engine``: the base loaded once, the protected Grams captured once, the backbone scored
               once (``setup``, shown apart); then per candidate its factors built and its hooks run
    evolve     per candidate what mergekit-evolve does: the merged model formed (W + the candidate's dense update
               in every module), written to disk (safetensors), loaded again, the same prompts run

Both score with probe's ``item_scores``; the largest difference of their log-likelihoods is shown. ``--threads``
(default 1) sets torch's threads. The table goes to stdout and ``OUT/search.md`` (raw figures: ``OUT/search.json``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
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
    print(f"[search bench {time.perf_counter() - T0:6.1f}s] {msg}", file=sys.stderr, flush=True)


def make_data(root: Path, a) -> Path:
    """The random base, adapters bb and t0, prompt files target.jsonl and protect.jsonl under ``root``."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from vecmerge.testing import toy_adapter

    config = Qwen3Config(vocab_size=a.vocab, num_hidden_layers=a.layers, **(TINY if a.tiny else QWEN3_06B))
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        Qwen3ForCausalLM(config).save_pretrained(root / "base")
    for name, seed in (("bb", 1), ("t0", 2)):
        toy_adapter(root / name, config=config, rank=a.rank, seed=seed)
    gen = torch.Generator().manual_seed(0)
    for name, offset in (("target", 0), ("protect", 1)):
        rows = [{"id": i, "prompt_ids": [int(t) for t in torch.randint(2, a.vocab, (a.tokens,), generator=gen)],
                 "target_ids": [offset + 2 * (i % 50)]} for i in range(a.prompts)]
        (root / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root / "base"


def run_vecmerge(root: Path, a) -> dict:
    from vecmerge import Workspace

    # the search's stages, timed apart: its setup, the grid's candidates, each built and scored
    from vecmerge.search import engine
    from vecmerge.search.candidate import build
    from vecmerge.search.optimize import grid
    from vecmerge.search.space import candidate

    t = time.perf_counter()
    setup = engine.prepare(Workspace(root=root), base="bb", dirs=["t0 - bb"], target={"t": str(root / "target.jsonl")},
                           protect={"p": str(root / "protect.jsonl")}, margin=1.0, trust_max=0.05,
                           base_model=root / "base", batch=a.batch)
    prep = time.perf_counter() - t
    cands = [candidate(setup.space, p) for p in grid(setup.space, a.candidates, 0)]
    t = time.perf_counter()
    scores = [setup.scorer.scores(build(c, setup.factors).updates) for c in cands]
    per = (time.perf_counter() - t) / len(cands)
    setup.scorer.close()
    return {"setup_s": prep, "per_candidate_s": per, "cands": cands, "scores": scores, "setup": setup}


def run_evolve(root: Path, a, cands: list, setup) -> dict:
    """The mergekit-evolve way: per candidate the merged model written, loaded and run (module docstring)."""
    from transformers import AutoModelForCausalLM

    # the evolve way's pieces: the base loaded as probe loads it, a candidate's dense update, the same scoring
    from vecmerge.probe.quiet import quiet_libraries
    from vecmerge.probe.runner import load_base
    from vecmerge.search.candidate import dense
    from vecmerge.search.evaluate import Scorer

    base = load_base(root / "base", torch.device("cpu"))
    original = {n: p.detach().clone() for n, p in base.state_dict().items()}
    tmp = Path(tempfile.mkdtemp(prefix="evolve-", dir=root))
    out, t = [], time.perf_counter()
    for c in cands:
        updates = dense(c, setup.factors)
        with torch.no_grad():
            for m, W in updates.items():
                base.get_submodule(m).weight.copy_(original[f"{m}.weight"] + W.float())
        base.save_pretrained(tmp / "merged")
        base.load_state_dict(original)
        with quiet_libraries():
            merged = AutoModelForCausalLM.from_pretrained(tmp / "merged", dtype=torch.float32).eval()
        scorer = Scorer(merged, [], setup.sets, batch=a.batch)
        out.append(scorer.scores({}))
        scorer.close()
        shutil.rmtree(tmp / "merged")
    per = (time.perf_counter() - t) / len(cands)
    shutil.rmtree(tmp)
    return {"per_candidate_s": per, "scores": out}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("bench-out/search"))
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--candidates", type=int, default=6)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--tiny", action="store_true", help="a hidden-64 model: a smoke run")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    a.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="bench-search-") as d:
        root = Path(d)
        log("making the model, the adapters and the prompts")
        make_data(root, a)
        log(f"vecmerge: {a.candidates} candidates")
        v = run_vecmerge(root, a)
        log(f"evolve way: {a.candidates} candidates")
        e = run_evolve(root, a, v["cands"], v["setup"])
    diff = max(abs(x[s][i]["loglik"] - y[s][i]["loglik"]) / max(1.0, abs(y[s][i]["loglik"]))
               for x, y in zip(v["scores"], e["scores"]) for s in x for i in x[s])
    shape = "tiny (hidden 64)" if a.tiny else "Qwen3-0.6B layers (hidden 1024, MLP 3072)"
    rows = [("vecmerge search", v["per_candidate_s"], f"setup once {v['setup_s']:.2f} s (load, capture, backbone)"),
            ("mergekit-evolve way", e["per_candidate_s"], "merged model written, loaded, run per candidate")]
    lines = [f"search bench: {shape}, {a.layers} layers, vocab {a.vocab}, rank {a.rank}, {a.prompts} + {a.prompts} "
             f"items of {a.tokens + 1} tokens, {a.candidates} candidates, {a.threads} thread(s)", "",
             "| way | s per candidate | candidates per minute | note |", "|---|---|---|---|"]
    lines += [f"| {n} | {s:.3f} | {60 / s:.1f} | {note} |" for n, s, note in rows]
    lines += ["", f"ratio: vecmerge evaluates {e['per_candidate_s'] / v['per_candidate_s']:.1f}x the candidates per "
                  f"minute; largest relative loglik difference between the ways {diff:.2g}"]
    table = "\n".join(lines)
    print(table)
    (a.out / "search.md").write_text(table + "\n")
    (a.out / "search.json").write_text(json.dumps({"args": {k: str(x) for k, x in vars(a).items()},
                                                   "vecmerge": {k: v[k] for k in ("setup_s", "per_candidate_s")},
                                                   "evolve": {"per_candidate_s": e["per_candidate_s"]},
                                                   "max_rel_diff": diff}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
