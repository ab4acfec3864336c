"""``make bench``: vecmerge's v58 step against the I/O floor, a dense reference and PEFT, side by side.

For each shape (Qwen3-0.6B r=32, Llama-3-8B r=64, Llama-3-70B r=16; q/k/v/o/gate/up/down of every
layer) it writes a synthetic v28/v51/v54e2/v54 trajectory, then measures in one run:

- ``vecmerge --quiet project --base v54 --dir v51-v28 --trust 0.0113 --consensus-ref v54-v54e2``
  as a whole process (wall time, peak RSS), alternating with the I/O floor process (read the four
  inputs, write an output of the same size, with safetensors alone), best of ``--repeat``;
- ``vecmerge.pipeline.run`` timed in-process (imports excluded);
- a dense float64 reference (dense DeltaW, sum, ``torch.linalg.svd``, cut) on one layer, extrapolated;
- PEFT ``add_weighted_adapter`` with ``svd`` (at our output's rank) and ``cat`` on a model with
  fewer layers, extrapolated per layer; plus how far our written update is from each reference.

Then the classic merges (``bench_merges.py``): vecmerge's ``ties`` in full and core space and
``dare_ties`` against PEFT's ``ties_svd`` / ``dare_ties_svd`` on the same three adapters at Qwen3-0.6B
shapes (``--merges-layers`` layers measured, extrapolated to 28): time, peak memory, how far each cut is
from the optimal one, and how far the two results are apart. Then the spectral merges (``bench_spectral.py``):
vecmerge's factored TSV-M, Iso-C, Iso-CTS, KnOTS-TIES and SVC against their dense definitions, module by
module at Llama-3-8B shapes: time and memory side by side, and how far the two results are apart.

Progress goes to stderr; the table to stdout and to ``OUT/results.md`` (raw figures: ``results.json``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_merges as bm  # noqa: E402
import bench_refs as br  # noqa: E402
import bench_spectral as bs  # noqa: E402

HERE = Path(__file__).resolve().parent
HELPER = str(HERE / "bench_refs.py")
T0 = time.perf_counter()
MIB, GIB = 2**20, 2**30


def log(msg: str) -> None:
    print(f"[bench {time.perf_counter() - T0:6.1f}s] {msg}", file=sys.stderr, flush=True)


def machine() -> dict:
    from importlib.metadata import version

    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")), platform.processor())
    sh = lambda c: subprocess.run(c, shell=True, capture_output=True, text=True).stdout.strip()  # noqa: E731
    return {"date": datetime.datetime.now().isoformat(timespec="seconds"), "cpu": cpu, "nproc": sh("nproc"),
            "free_g": sh("free -g"), "uptime": sh("uptime"), "python": platform.python_version(),
            **{k: version(k) for k in ("torch", "peft", "transformers", "safetensors")}}


def mem_available() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 24 * GIB


def startup(n: int = 5) -> dict:
    """Best-of-n wall time and peak RSS of tiny processes next to ``vecmerge --help``."""
    py = sys.executable
    cmds = {"python -c pass": [py, "-c", "pass"], "python -c 'import torch'": [py, "-c", "import torch"],
            "python -c 'import torch, safetensors.torch'": [py, "-c", "import torch, safetensors.torch"],
            "vecmerge --help": [*br.vecmerge_exe(), "--help"]}
    out = {}
    for label, cmd in cmds.items():
        runs = [br.measure(cmd) for _ in range(n)]
        out[label] = {"wall": min(r["wall"] for r in runs), "peak": max(r["peak"] for r in runs)}
        log(f"startup {label}: best of {n} {out[label]['wall']:.3f} s")
    return out


def per_type_total(times: dict, names) -> float:
    """Extrapolate per-module seconds to ``names`` by module type (mean of the sampled ones)."""
    by: dict = {}
    for m, s in times.items():
        by.setdefault(m.rsplit(".", 1)[-1], []).append(s)
    mean = {t: sum(v) / len(v) for t, v in by.items()}
    return sum(mean[m.rsplit(".", 1)[-1]] for m in names)


def bench_shape(name: str, a, baseline_rss: int) -> dict:
    """Every measurement for one shape; the small shapes also get the in-process run and the dense reference."""
    spec, env = br.SHAPES[name], a.env
    small = name in ("tiny", "qwen3-0.6b")
    base, cap = a.out / name, min(24 * GIB, mem_available() - 2 * GIB)
    cap = cap if a.device == "cpu" else None  # CUDA maps far more address space than it uses: no cap there
    root, out_vm, out_floor = base / "data", base / "out-vecmerge", base / "out-floor"
    log(f"{name}: writing/reusing synthetic adapters under {root}")
    br.last_json(br.measure([sys.executable, HELPER, "data", str(root), "-", "--shape", name]))
    shapes = br.module_shapes(name)
    res = {"shape": name, "spec": spec, "modules": len(shapes), "mem_cap": cap, "baseline_rss": baseline_rss,
           "input_bytes": sum((root / n / br.WEIGHTS).stat().st_size for n in br.INPUTS),
           "largest_module": max((o + i) * spec["r"] * 4 for o, i in shapes.values())}
    shutil.rmtree(out_vm, ignore_errors=True)
    vm_runs, floor_runs = [], []
    for i in range(a.repeat if small else 1):
        log(f"{name}: vecmerge --device {a.device} project, run {i + 1} (address space "
            f"{f'capped at {cap / GIB:.1f} GiB' if cap else 'not capped'}, killed after {a.timeout:g} s)")
        r = br.measure(br.project_cmd(out_vm), cwd=root, mem_limit=cap, env=env, timeout=a.timeout)
        vm_runs.append(r)
        done = r["rc"] == 0
        if not done:
            why = "timed out" if r["timed_out"] else f"exit {r['rc']}: {r['stderr'].strip()[-300:]}"
            log(f"{name}: vecmerge did not complete ({why})")
        log(f"{name}: I/O floor, run {i + 1}")
        like = ["--like", str(out_vm / br.WEIGHTS)] if done else [
            "--like", str(root / "v54" / br.WEIGHTS), "--rank-factor", "1.5"]  # the step's exact rank is 3r/2
        floor_runs.append(br.measure([sys.executable, HELPER, "floor", str(root), str(out_floor), *like],
                                     mem_limit=cap, env=env))
        if not done:
            break
    if vm_runs[-1]["rc"] == 0:
        for label, cmd in (("verify", br.verify_cmd(out_vm)), ("audit", br.audit_cmd())):
            if label == "audit" and not small:
                continue
            runs = [br.measure(cmd, cwd=root, mem_limit=cap, env=env, timeout=a.timeout)
                    for _ in range(a.repeat if small else 1)]
            log(f"{name}: vecmerge {label}: best {min(r['wall'] for r in runs):.2f} s, exit {runs[-1]['rc']}")
            res[label] = {"wall": min(r["wall"] for r in runs), "peak": max(r["peak"] for r in runs),
                          "rc": runs[-1]["rc"], "error": runs[-1]["stderr"].strip()[-300:] if runs[-1]["rc"] else None}
        if a.device != "cpu":  # the accelerator's output, re-derived and checked on the CPU: an independent check
            r = br.measure(br.verify_cmd(out_vm, "cpu"), cwd=root, env=env, timeout=a.timeout)
            log(f"{name}: vecmerge --device cpu verify of the {a.device} output: {r['wall']:.2f} s, exit {r['rc']}")
            res["verify_cpu"] = {"wall": r["wall"], "peak": r["peak"], "rc": r["rc"],
                                 "error": r["stderr"].strip()[-300:] if r["rc"] else None}
    best = min(vm_runs, key=lambda r: r["wall"])
    res["vecmerge"] = {"wall": best["wall"], "peak": max(r["peak"] for r in vm_runs), "rc": vm_runs[-1]["rc"],
                       "timed_out": vm_runs[-1]["timed_out"], "walls": [r["wall"] for r in vm_runs],
                       "error": vm_runs[-1]["stderr"].strip()[-500:] if vm_runs[-1]["rc"] else None}
    res["floor"] = {"wall": min(r["wall"] for r in floor_runs), "peak": max(r["peak"] for r in floor_runs),
                    "walls": [r["wall"] for r in floor_runs], **br.last_json(floor_runs[0])}
    if small:
        log(f"{name}: vecmerge.pipeline.run in-process" + (" under cProfile" if a.profile else ""))
        prof = ["--profile", str(a.out / f"profile-{name}.txt")] if a.profile else []
        r = br.measure([sys.executable, HELPER, "inproc", str(root), str(base / "out-inproc"), *prof], env=env)
        res["inproc"] = {**br.last_json(r), "process_peak": r["peak"]}
    sample = [m for m in shapes if m.startswith("model.layers.0.")]
    if (small or a.dense_all) and name != "llama3-70b" and not a.no_dense:
        log(f"{name}: dense float64 reference on {len(sample)} modules of layer 0")
        r = br.measure([sys.executable, HELPER, "dense", str(root), str(out_vm), "--shape", name,
                        "--modules", *sample], env=env, mem_limit=cap)
        per = br.last_json(r)
        res["dense"] = {"sampled": len(per), "peak": r["peak"], "modules": per,
                        "wall": per_type_total({m: e["seconds"] for m, e in per.items()}, shapes)}
    if name != "llama3-70b" and not a.no_peft:
        layers = min(a.peft_layers_8b if name == "llama3-8b" else (a.peft_layers or spec["layers"]), spec["layers"])
        log(f"{name}: PEFT add_weighted_adapter svd + cat on a {layers}-layer model")
        r = br.measure([sys.executable, HELPER, "peft", str(root), str(out_vm), "--shape", name,
                        "--layers", str(layers), "--modules", *sample], env=env, mem_limit=cap)
        p = br.last_json(r)
        scale = spec["layers"] / layers
        res["peft"] = {**p, "peak": r["peak"], "scale": scale, "svd_wall": p["svd_s"] * scale,
                       "cat_wall": p["cat_s"] * scale}
    return res


def sec(x: float) -> str:
    return f"{x:.2f}" if x < 10 else f"{x:,.1f}"


def ratio(x, y, bound: str = "") -> str:
    return f"{bound}{x / y:,.1f}x" if x and y else "-"


def worst(errs) -> str:
    errs = [e for e in errs if e is not None]
    return f"{max(errs):.1e}" if errs else "n/a (no vecmerge output)"


def table(results: list, start: dict) -> str:
    rows = ["| shape | measure | wall s | peak RSS MiB | time / floor | mem / floor | ref time / vecmerge "
            "(process; in-process) | max rel. Frobenius error vs ours |", "|" + "---|" * 8]
    for r in results:
        s, vm, fl, inp = r["shape"], r["vecmerge"], r["floor"], r.get("inproc")
        ok = vm["rc"] == 0
        # A killed run is a lower bound on vecmerge's time: ratios to it become upper bounds.
        lo, up = ("", "") if ok else ("> ", "< ")
        state = "" if ok else (" (killed at the time limit)" if vm["timed_out"] else f" (FAILED, exit {vm['rc']})")
        rows.append(f"| {s} | I/O floor process (read 4 inputs, write output) | {sec(fl['wall'])} | "
                    f"{fl['peak'] / MIB:,.0f} | 1.0x | 1.0x | | |")
        rows.append(f"| {s} | **vecmerge project** process{state} | {lo}{sec(vm['wall'])} | {lo}{vm['peak'] / MIB:,.0f}"
                    f" | {ratio(vm['wall'], fl['wall'], lo)} | {ratio(vm['peak'], fl['peak'], lo)} | | |")
        for label in ("verify", "verify_cpu", "audit"):
            if label in r:
                x = r[label]
                what = "verify --device cpu of that output" if label == "verify_cpu" else label
                rows.append(f"| {s} | vecmerge {what} process{'' if x['rc'] == 0 else ' (FAILED)'} | "
                            f"{sec(x['wall'])} | {x['peak'] / MIB:,.0f} | {ratio(x['wall'], fl['wall'])} | "
                            f"{ratio(x['peak'], fl['peak'])} | | |")
        if inp:
            rows.append(f"| {s} | vecmerge `pipeline.run` in-process | {sec(inp['wall'])} | "
                        f"+{(inp['peak'] - inp['rss_before']) / MIB:,.0f} over imports | | | | |")

        def ref(label, wall, mem, err, s=s, fl=fl, vm=vm, inp=inp, up=up):
            return (f"| {s} | {label} | {sec(wall)} | {mem} | {ratio(wall, fl['wall'])} | | "
                    f"{ratio(wall, vm['wall'], up)}; {ratio(wall, inp['wall'] if inp else 0)} | {err} |")

        if "dense" in r:
            d = r["dense"]
            rows.append(ref(f"dense f64 reference (extrapolated from {d['sampled']} modules)", d["wall"],
                            f"{d['peak'] / MIB:,.0f}", worst(e["rel_err"] for e in d["modules"].values())))
        if "peft" in r:
            p = r["peft"]
            how = f"measured on {p['layers']} layer(s), x{p['scale']:g}" if p["scale"] != 1 else "all modules"
            for kind in ("svd", "cat"):
                rank = f"rank {p['svd_rank']}" if kind == "svd" else "exact"
                rows.append(ref(f"PEFT `{kind}` merge call ({rank}; {how})", p[kind + "_wall"],
                                f"+{p[kind + '_extra_mem'] / MIB:,.0f} during merge",
                                worst(e[kind] for e in p["modules"].values()) if p["modules"] else worst([])))
    rows += ["", "| start-up (best of 5) | wall s | peak RSS MiB |", "|---|---|---|"]
    rows += [f"| `{k}` | {v['wall']:.3f} | {v['peak'] / MIB:,.0f} |" for k, v in start.items()]
    return "\n".join(rows)


def targets(results: list, start: dict) -> list[str]:
    """Issue 15's targets, each with its measured figure and met/MISSED."""
    lines = []
    for r in results:
        name, vm, fl = r["shape"], r["vecmerge"], r["floor"]
        ok = vm["rc"] == 0
        state = "" if ok else (f" (killed after {vm['wall']:.0f} s: bounds only)" if vm["timed_out"]
                               else f" (FAILED: {(vm['error'] or '').splitlines()[-1:]})")
        bound = {"qwen3-0.6b": 1.5, "tiny": 1.5}.get(name, 4.0)
        q = vm["wall"] / fl["wall"]
        lines.append(f"- {name}: project process within {bound:g}x of the I/O floor: {q:.2f}x{state} -> "
                     f"{'met' if ok and q <= bound else 'MISSED'}")
        if "audit" in r:
            qa = r["audit"]["wall"] / fl["wall"]
            lines.append(f"- {name}: audit process within 1.5x of the I/O floor: {qa:.2f}x -> "
                         f"{'met' if r['audit']['rc'] == 0 and qa <= 1.5 else 'MISSED'}")
        if "verify" in r and name in ("llama3-8b", "llama3-70b"):
            v = r["verify"]
            qv, mv = v["wall"] / vm["wall"], v["peak"] / vm["peak"]
            lines.append(f"- {name}: verify no slower than 2x project ({qv:.2f}x) and no more memory ({mv:.2f}x) -> "
                         f"{'met' if v['rc'] == 0 and qv <= 2 and mv <= 1.0 else 'MISSED'}")
        if name in ("llama3-8b", "llama3-70b"):
            over = vm["peak"] - r["input_bytes"]
            lines.append(f"- {name}: peak RSS {vm['peak'] / GIB:.2f} GiB = inputs {r['input_bytes'] / GIB:.2f} GiB + "
                         f"{over / GIB:.2f} GiB (start-up {r['baseline_rss'] / GIB:.2f} GiB of it); "
                         f"budget inputs + 1 GiB -> {'met' if ok and over <= GIB else 'MISSED'}{state}")
        if "peft" in r:
            lines.append(f"- {name}: PEFT svd (extrapolated) / vecmerge process: "
                         f"{r['peft']['svd_wall'] / vm['wall']:,.1f}x")
    h = start["vecmerge --help"]["wall"]
    lines.append(f"- `vecmerge --help` {h:.3f} s (best of 5) -> {'met' if h < 0.5 else 'MISSED'} (under 0.5 s)")
    return lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="Qwen3-0.6B only, PEFT on 2 layers (extrapolated).")
    p.add_argument("--tiny", action="store_true", help="A 2-layer hidden-64 model only (smoke run).")
    p.add_argument("--shapes", help=f"Comma-separated subset of {', '.join(br.SHAPES)}.")
    p.add_argument("--out", type=Path, default=Path("bench-out"), help="Scratch folder (default: bench-out).")
    p.add_argument("--repeat", type=int, default=2, help="Alternating vecmerge/floor runs; best is kept.")
    p.add_argument("--peft-layers", type=int, help="Layers of the 0.6B PEFT model (default: all 28).")
    p.add_argument("--peft-layers-8b", type=int, default=1, help="Layers of the 8B PEFT model (default: 1).")
    p.add_argument("--no-peft", action="store_true")
    p.add_argument("--no-dense", action="store_true")
    p.add_argument("--dense-all", action="store_true", help="Also run the dense reference at 8B (minutes per module).")
    p.add_argument("--timeout", type=float, default=600, help="Kill a vecmerge run after this many seconds (600).")
    p.add_argument("--profile", action="store_true", help="Run the in-process merge under cProfile.")
    p.add_argument("--keep", action="store_true", help="Keep the synthetic adapters for the next run.")
    p.add_argument("--threads", type=int, help="OMP_NUM_THREADS/MKL_NUM_THREADS for every measured process.")
    p.add_argument("--merges-layers", type=int, default=1, help="Layers of the merge rows' model (default 1, x28).")
    p.add_argument("--no-merges", action="store_true", help="Skip the classic-merge rows (TIES, DARE vs PEFT).")
    p.add_argument("--merges-only", action="store_true", help="Only the classic-merge rows.")
    p.add_argument("--no-spectral", action="store_true", help="Skip the spectral rows (factored vs dense, 8B).")
    p.add_argument("--spectral-only", action="store_true", help="Only the spectral rows.")
    p.add_argument("--spectral-modules", default=",".join(bs.MODULES),
                   help="Modules of the spectral rows (default k_proj,q_proj; up_proj adds half an hour).")
    p.add_argument("--device", default="cpu",
                   help="--device of the timed vecmerge processes (cuda: also a CPU verify of the output).")
    a = p.parse_args(argv)
    br.DEVICE = a.device
    a.env = {v: str(a.threads) for v in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")} if a.threads else {}
    names = ["qwen3-0.6b", "llama3-8b", "llama3-70b"]
    if a.quick:
        names, a.peft_layers = ["qwen3-0.6b"], a.peft_layers or 2
    if a.tiny:
        names, a.repeat = ["tiny"], 1
    if a.shapes:
        names = a.shapes.split(",")
    if a.merges_only or a.spectral_only:
        names = []
    if a.spectral_only:
        a.no_merges = True
    a.out = a.out.resolve()
    a.out.mkdir(parents=True, exist_ok=True)
    info = machine()
    log(f"machine: {info['cpu']}, {info['nproc']} cores; load: {info['uptime']}")
    start = startup()
    baseline = start["python -c 'import torch, safetensors.torch'"]["peak"]
    results = []
    for name in names:
        results.append(bench_shape(name, a, baseline))
        if not a.keep:
            shutil.rmtree(a.out / name, ignore_errors=True)
    merges = None
    if not a.no_merges:
        merges = bm.run_all(a.out / "merges", a.merges_layers, env=a.env, log=log)
    spectral = None
    if not a.no_spectral and (not a.merges_only or a.spectral_only):
        mods = tuple(next(x for x in bs.ALL_MODULES if x.endswith(m)) for m in a.spectral_modules.split(","))
        spectral = bs.run_all(a.out / "spectral", mods, log=log, env=a.env)
    info["uptime_end"] = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    cmd = "python benchmarks/run.py " + " ".join(argv if argv is not None else sys.argv[1:])
    head = (f"`{cmd.strip()}` on {info['date']}: {info['cpu']}, {info['nproc']} cores, torch {info['torch']}, "
            f"peft {info['peft']}, threads: {a.threads or 'torch default'}")
    if a.device != "cpu":
        gpu = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.get_device_name(), "
                              "torch.version.cuda)"], capture_output=True, text=True).stdout.strip()
        head += (f"; vecmerge on `--device {a.device}` ({gpu}; peak RSS is host memory only, "
                 "the floor stays on the CPU)")
    mem = next((ln for ln in info["free_g"].splitlines() if ln.startswith("Mem:")), "")
    cols = mem.split()
    mem = f"{cols[1]} GiB total, {cols[-1]} GiB available (free -g)" if len(cols) == 7 else mem
    md = "\n".join([head, f"memory: {mem}", f"load before: {info['uptime']}",
                    f"load after: {info['uptime_end']}", "",
                    table(results, start), "", "Targets:", *targets(results, start),
                    *(["", *bm.rows(merges)] if merges else []), *(["", *bs.rows(spectral)] if spectral else [])])
    (a.out / "results.md").write_text(md + "\n")
    (a.out / "results.json").write_text(json.dumps({"machine": info, "startup": start, "results": results,
                                                    "merges": merges, "spectral": spectral}, indent=2, default=str))
    print(md)
    log(f"done; results in {a.out / 'results.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
