"""``make bench`` rows for the classic merges: vecmerge's TIES (full and core space) and DARE-TIES against
PEFT's ``ties_svd`` / ``dare_ties_svd`` on the same inputs, at Qwen3-0.6B module shapes.

Inputs: v28, v51, v54 of ``vecmerge.testing.toy_trajectory`` (rank 32, fp32) for the first ``--layers``
layers of Qwen3-0.6B (7 modules a layer; default 1 layer, extrapolated to 28 by the number of layers).
The merge: weights (0.25, 0.25, 0.5) (dyadic: PEFT rounds weights to float32), density 0.5, majority
"total", output rank 32 (PEFT's ``svd_rank``; our ``--rank 32``; core space writes ``--rank exact``).

Each measurement is its own process (peak RSS from ``wait4``), timed around the merge call alone
(imports, model building and adapter loading excluded), with the memory growth during the call
(``VmHWM`` reset through ``/proc/self/clear_refs``):

- ``ours``: ``vecmerge.pipeline.run`` of the recipe (reads the inputs, merges, cuts, writes);
- ``peft``: ``add_weighted_adapter(["v28", "v51", "v54"], w, combination_type=...)`` on a Qwen3 built on
  the meta device and left uninitialised (the merge never reads base weights); for ``dare_ties_svd``
  PEFT's global generator is seeded per module with our ``module_seed(seed, module)``, so both sides
  draw the same masks and agree up to float32;
- ``check`` (untimed): every module's intended merge ``T`` (float64, vecmerge's kernels, tested bit for
  bit against PEFT's), its optimal rank-32 cut error from the full spectrum, our written update's error
  and PEFT's, and the difference between the two written updates.

Run alone: ``python benchmarks/bench_merges.py [--layers 1] [--out bench-out/merges]`` (a few minutes on
two cores); ``benchmarks/run.py`` runs it as part of ``make bench``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_refs as br  # noqa: E402

SHAPE = "qwen3-0.6b"
MODELS = ("v28", "v51", "v54")
WEIGHTS = (0.25, 0.25, 0.5)
DENSITY, RANK, SEED = 0.5, 32, 0
HELPER = str(Path(__file__).resolve())
RUNS = {  # label: (our recipe's method and space, PEFT's combination type)
    "ties full": ("ties", "full", "ties_svd"),
    "ties core": ("ties", "core", "ties_svd"),
    "dare_ties full": ("dare_ties", "full", "dare_ties_svd"),
}


def make_data(root: Path, layers: int, shape: str = SHAPE) -> Path:
    """v28, v51, v54 (and v54e2) at ``shape``'s module shapes and rank for ``layers`` layers (reused when present)."""
    from vecmerge.testing import llm_shapes, toy_trajectory

    stamp = root / "bench-stamp.json"
    want = json.dumps({"shape": shape, "layers": layers})
    if stamp.is_file() and stamp.read_text() == want:
        return root
    s = br.SHAPES[shape]
    toy_trajectory(root, shapes=llm_shapes(layers, s["hidden"], s["intermediate"], s["heads"], s["kv_heads"],
                                           s["head_dim"]), rank=s["r"] // 2)
    stamp.write_text(want)
    return root


def recipe(method: str, space: str, out: Path) -> dict:
    rec = {"method": method, "models": [{"model": m, "weight": w} for m, w in zip(MODELS, WEIGHTS)],
           "density": DENSITY, "space": space, "rank": str(RANK) if space == "full" else "exact", "out": str(out)}
    if method.startswith("dare"):
        rec["seed"] = SEED
    return rec


def ours(root: Path, out: Path, method: str, space: str) -> dict:
    """One merge in-process (imports excluded): ``evaluate`` (read and hash the inputs, one basis and the
    cores per module) and ``build_output`` (the merge and the cut of every module) timed apart, then
    ``pipeline.run`` for the written output (the whole job, timed too)."""
    from vecmerge import Recipe, Workspace, evaluate, run

    # a building block timed on its own (internal): the pipeline's merge-and-cut stage
    from vecmerge.pipeline.build import build_output

    rec = Recipe.from_dict(recipe(method, space, out), "bench")
    before = br.rss()
    br.reset_peak()
    t0 = time.perf_counter()
    ev = evaluate(rec, Workspace(root=root))
    t1 = time.perf_counter()
    build_output(ev, 1.0)
    t2 = time.perf_counter()
    extra = max(br.rss("VmHWM") - before, 0)
    del ev
    t3 = time.perf_counter()
    rep = run(rec, Workspace(root=root), force=True)
    whole = time.perf_counter() - t3
    mods = rep.outputs[0].figures["modules"]
    return {"wall": t2 - t0, "evaluate": t1 - t0, "build": t2 - t1, "whole_run": whole, "extra_mem": extra,
            "cuts": sorted({e.get("cut", "core") for e in mods.values()}),
            "rank_max": max(e["rank"] for e in mods.values()), "survival": rep.outputs[0].figures["survival"]}


def peft(root: Path, out: Path, kind: str, layers: int, shape: str = SHAPE) -> dict:
    """PEFT's ``add_weighted_adapter`` of the same merge, timed around the call; the result saved to ``out``."""
    import gc
    import logging
    import warnings

    import torch
    from peft import PeftModel
    from peft.tuners.lora import LoraLayer
    from peft.tuners.lora.model import LoraModel

    # a building block (internal): the per-module seed the kernels draw DARE's masks from
    from vecmerge.linalg.merge_kernels import module_seed

    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    torch.set_num_threads(1)  # as vecmerge's kernels: one thread each on a shared machine
    pm = PeftModel.from_pretrained(br.build_model(shape, layers), str(root / MODELS[0]), adapter_name=MODELS[0])
    for n in MODELS[1:]:
        pm.load_adapter(str(root / n), adapter_name=n)
    names = {id(mod): n.removeprefix("base_model.model.") for n, mod in pm.named_modules()
             if isinstance(mod, LoraLayer)}
    orig = LoraModel._svd_generalized_task_arithmetic_weighted_adapter

    def seeded(self, combination_type, adapters, weights, new_rank, target, *args, **kwargs):
        torch.manual_seed(module_seed(SEED, names[id(target)]))  # our masks, so that both sides agree
        return orig(self, combination_type, adapters, weights, new_rank, target, *args, **kwargs)

    LoraModel._svd_generalized_task_arithmetic_weighted_adapter = seeded
    gc.collect()
    before = br.rss()
    br.reset_peak()
    t0 = time.perf_counter()
    try:
        with torch.no_grad():
            pm.add_weighted_adapter(list(MODELS), list(WEIGHTS), "m", combination_type=kind, svd_rank=RANK,
                                    density=DENSITY)
    finally:
        LoraModel._svd_generalized_task_arithmetic_weighted_adapter = orig
    wall = time.perf_counter() - t0
    extra = max(br.rss("VmHWM") - before, 0)
    pm.save_pretrained(str(out), selected_adapters=["m"])
    return {"wall": wall, "extra_mem": extra}


def read_merged(folder: Path, module: str):
    """The dense update of ``module`` in a saved adapter (PEFT's own subfolder for a named adapter)."""
    sub = folder / "m" if (folder / "m" / br.WEIGHTS).is_file() else folder
    return br.read_dense(sub, module)


def _above(err: float, opt: float) -> float:
    """``err / opt - 1``; a cut at or above the module's rank (opt ~ 0) is optimal up to fp32 rounding."""
    return err / opt - 1 if opt > 1e-6 else (0.0 if err <= 1e-6 else float("inf"))


def check(root: Path, ours_out: Path, peft_out: Path, method: str, space: str, layers: int, shape: str = SHAPE
          ) -> dict:
    """Per module: ``T`` (float64), the optimal rank-32 error, ours and PEFT's errors, ours against PEFT's."""
    import torch

    # building blocks measured against PEFT's (internal): the deterministic merge kernels
    from vecmerge.linalg.merge_kernels import dare_ties, module_seed, ties

    w = torch.tensor(WEIGHTS, dtype=torch.float64)
    worst = {"ours_over_optimal": 0.0, "peft_over_optimal": 0.0, "ours_vs_peft": 0.0, "ours_rel_error": 0.0}
    per = {}
    for m in br.module_shapes(shape, layers):
        X = torch.stack([br.read_dense(root / n, m) for n in MODELS])
        if method == "ties":
            T = ties(X, w, DENSITY)
        else:
            T = dare_ties(X, w, DENSITY, torch.Generator().manual_seed(module_seed(SEED, m)), mask_dtype=torch.float32)
        S = torch.linalg.svdvals(T)
        tn = float(torch.linalg.norm(T))
        opt = float(torch.sqrt((S[RANK:] ** 2).sum())) / tn
        mine, theirs = br.read_dense(ours_out, m), read_merged(peft_out, m)
        e = {"optimal": opt, "ours": br.rel_err(mine, T), "peft": br.rel_err(theirs, T),
             "ours_vs_peft": br.rel_err(mine, theirs)}
        per[m] = e
        if space == "full":
            worst["ours_over_optimal"] = max(worst["ours_over_optimal"], _above(e["ours"], opt))
        worst["peft_over_optimal"] = max(worst["peft_over_optimal"], _above(e["peft"], opt))
        worst["ours_vs_peft"] = max(worst["ours_vs_peft"], e["ours_vs_peft"])
        worst["ours_rel_error"] = max(worst["ours_rel_error"], e["ours"])
    return {"worst": worst, "modules": per}


def run_all(out: Path, layers: int, env: dict | None = None, log=print, shape: str = SHAPE) -> dict:
    """Every row: data, then per run ours, PEFT and the check, each a measured process."""
    root = out / "data"
    sh = ["--shape", shape, "--layers", str(layers)]
    br.last_json(br.measure([sys.executable, HELPER, "data", str(root), *sh]))
    res = {"shape": shape, "layers": layers, "scale": br.SHAPES[shape]["layers"] / layers, "runs": {}}
    peft_done = {}
    for label, (method, space, kind) in RUNS.items():
        o = out / label.replace(" ", "-")
        log(f"merges: {label}: vecmerge")
        r = br.measure([sys.executable, HELPER, "ours", str(root), str(o / "ours"), "--method", method, "--space",
                        space], env=env)
        row = {"ours": {**br.last_json(r), "peak": r["peak"]}}
        if kind not in peft_done:
            log(f"merges: {label}: PEFT {kind}")
            r = br.measure([sys.executable, HELPER, "peft", str(root), str(out / kind), "--kind", kind, *sh], env=env)
            peft_done[kind] = {**br.last_json(r), "peak": r["peak"]}
        row["peft"] = peft_done[kind]
        row["peft_kind"] = kind
        log(f"merges: {label}: checking every module against the optimal cut")
        r = br.measure([sys.executable, HELPER, "check", str(root), str(o / "ours"), "--peft-out", str(out / kind),
                        "--method", method, "--space", space, *sh], env=env)
        row["check"] = br.last_json(r)["worst"]
        res["runs"][label] = row
    return res


def rows(res: dict) -> list[str]:
    """Markdown table rows (and target lines) for ``run_all``'s result."""
    sc = res["scale"]
    out = [f"Merges at {res['shape']} shapes, {res['layers']} layer(s) ({res['layers'] * 7} modules) measured, "
           f"times x{sc:g} for all layers; 3 models of rank 32, weights 0.25/0.25/0.5, density 0.5; one thread each. "
           "vecmerge: evaluate (read and hash the inputs, cores) + build (merge, cut), not the write; "
           "PEFT: the add_weighted_adapter call alone (its adapters loaded before).", "",
           "| merge | vecmerge s: evaluate + build (build alone) | PEFT s | PEFT / vecmerge (build alone) "
           "| peak RSS MiB vecmerge / PEFT | merge-call memory MiB vecmerge / PEFT | our cut above optimal (max) "
           "| PEFT cut above optimal (max) | ours vs PEFT (max rel.) | our rank |",
           "|" + "---|" * 10]
    targets = []
    for label, r in res["runs"].items():
        o, p, c = r["ours"], r["peft"], r["check"]
        speed, speed_b = p["wall"] / o["wall"], p["wall"] / o["build"]
        above = f"{100 * c['ours_over_optimal']:.2f}%" if label.endswith("full") else "n/a (another merge)"
        out.append(f"| {label} vs `{r['peft_kind']}` | {o['wall'] * sc:.1f} ({o['build'] * sc:.1f}) | "
                   f"{p['wall'] * sc:.1f} | {speed:.1f}x ({speed_b:.1f}x) | "
                   f"{o['peak'] / br_mib():,.0f} / {p['peak'] / br_mib():,.0f} | {o['extra_mem'] / br_mib():,.0f} / "
                   f"{p['extra_mem'] / br_mib():,.0f} | {above} | {100 * c['peft_over_optimal']:.2f}% | "
                   f"{c['ours_vs_peft']:.2e} | {o['rank_max']} |")
        need = 50 if label == "ties core" else 3 if label == "ties full" else None
        if need:
            targets.append(f"- {label}: >= {need}x faster than PEFT `{r['peft_kind']}`: {speed:.1f}x with reading "
                           f"the inputs -> {'met' if speed >= need else 'MISSED'}; the merge and cut alone "
                           f"{speed_b:.1f}x -> {'met' if speed_b >= need else 'MISSED'}")
        if label == "ties full":
            ok = c["ours_over_optimal"] <= 0.01
            targets.append(f"- {label}: every module's cut within 1% of optimal: worst "
                           f"{100 * c['ours_over_optimal']:.2f}% -> {'met' if ok else 'MISSED'}")
        if label in ("ties full", "ties core"):
            targets.append(f"- {label}: peak memory below PEFT's: process {o['peak'] / br_mib():,.0f} vs "
                           f"{p['peak'] / br_mib():,.0f} MiB, merge call {o['extra_mem'] / br_mib():,.0f} vs "
                           f"{p['extra_mem'] / br_mib():,.0f} MiB -> "
                           f"{'met' if o['peak'] < p['peak'] and o['extra_mem'] < p['extra_mem'] else 'MISSED'}")
    return out + ["", "Targets (merges):", *targets]


def br_mib() -> int:
    return 2**20


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", nargs="?", default="all", choices=["all", "data", "ours", "peft", "check"])
    p.add_argument("root", nargs="?", type=Path)
    p.add_argument("out", nargs="?", type=Path)
    p.add_argument("--layers", type=int, default=1)
    p.add_argument("--shape", default=SHAPE, choices=list(br.SHAPES))
    p.add_argument("--method", default="ties")
    p.add_argument("--space", default="full")
    p.add_argument("--kind", default="ties_svd")
    p.add_argument("--peft-out", type=Path)
    p.add_argument("--bench-out", type=Path, default=Path("bench-out/merges"))
    a = p.parse_args(argv)
    if a.mode == "all":
        out = a.bench_out.resolve()
        out.mkdir(parents=True, exist_ok=True)
        res = run_all(out, a.layers, log=lambda s: print(s, file=sys.stderr, flush=True), shape=a.shape)
        (out / "results.json").write_text(json.dumps(res, indent=2))
        print("\n".join(rows(res)))
        return 0
    if a.mode == "data":
        res = {"root": str(make_data(a.root, a.layers, a.shape))}
    elif a.mode == "ours":
        res = ours(a.root, a.out, a.method, a.space)
    elif a.mode == "peft":
        res = peft(a.root, a.out, a.kind, a.layers, a.shape)
    else:
        res = check(a.root, a.out, a.peft_out, a.method, a.space, a.layers, a.shape)
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
