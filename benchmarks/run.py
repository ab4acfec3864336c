"""``make bench``: vecmerge's v58 step against the I/O floor, a dense reference and PEFT, side by side.

For each shape (Qwen3-0.6B r=32, Llama-3-8B r=64, Llama-3-70B r=16; q/k/v/o/gate/up/down of every
layer) it writes a synthetic v28/v51/v54e2/v54 trajectory, then measures in one run:

- ``vecmerge --quiet project --base v54 --dir v51-v28 --trust 0.0113 --consensus-ref v54-v54e2``
  as a whole process (wall time, peak RSS), alternating with the I/O floor process (read the four
  inputs, write an output of the same size, with safetensors alone), best of ``--repeat``;
- ``vecmerge.merge.run`` timed in-process (imports excluded);
- a dense float64 reference (dense DeltaW, sum, ``torch.linalg.svd``, cut) on one layer, extrapolated;
- PEFT ``add_weighted_adapter`` with ``svd`` (at our output's rank) and ``cat`` on a model with
  fewer layers, extrapolated per layer; plus how far our written update is from each reference.

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
import bench_refs as br  # noqa: E402

HERE = Path(__file__).resolve().parent
HELPER = str(HERE / "bench_refs.py")
T0 = time.perf_counter()
MIB, GIB = 2**20, 2**30


def log(msg: str) -> None:
    print(f"[bench {time.perf_counter() - T0:6.1f}s] {msg}", file=sys.stderr, flush=True)


def machine() -> dict:
    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")), platform.processor())
    sh = lambda c: subprocess.run(c, shell=True, capture_output=True, text=True).stdout.strip()  # noqa: E731
    import peft
    import torch
    import transformers

    return {"date": datetime.datetime.now().isoformat(timespec="seconds"), "cpu": cpu, "nproc": sh("nproc"),
            "free_g": sh("free -g"), "uptime": sh("uptime"), "python": platform.python_version(),
            "torch": torch.__version__, "peft": peft.__version__, "transformers": transformers.__version__,
            "torch_threads": torch.get_num_threads()}


def mem_available() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 24 * GIB


def startup(n: int = 5) -> dict:
    """Best-of-n wall time and peak RSS of tiny processes next to ``vecmerge --help``."""
    py, vm = sys.executable, str(Path(sys.executable).with_name("vecmerge"))
    cmds = {"python -c pass": [py, "-c", "pass"], "python -c 'import torch'": [py, "-c", "import torch"],
            "python -c 'import torch, safetensors.torch'": [py, "-c", "import torch, safetensors.torch"],
            "vecmerge --help": [vm, "--help"]}
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
    spec = br.SHAPES[name]
    base = a.out / name
    log(f"{name}: writing/reusing synthetic adapters under {base / 'data'}")
    root = br.make_data(base / "data", name)
    shapes = br.module_shapes(name)
    inputs = sum((root / n / br.WEIGHTS).stat().st_size for n in br.INPUTS)
    largest = max((o + i) * spec["r"] * 4 for o, i in shapes.values())
    big = name == "llama3-70b"
    cap = min(24 * GIB, mem_available() - 2 * GIB) if big else None
    res = {"shape": name, "spec": spec, "modules": len(shapes), "input_bytes": inputs, "largest_module": largest,
           "mem_cap": cap, "baseline_rss": baseline_rss}
    out_vm, out_floor = base / "out-vecmerge", base / "out-floor"
    vm_runs, floor_runs = [], []
    for i in range(1 if big else a.repeat):
        log(f"{name}: vecmerge project, run {i + 1}" + (f" (address space capped at {cap / GIB:.1f} GiB)"
                                                        if cap else ""))
        r = br.measure(br.project_cmd(out_vm), cwd=root, mem_limit=cap)
        vm_runs.append(r)
        if r["rc"] != 0:
            log(f"{name}: vecmerge failed (exit {r['rc']}): {r['stderr'].strip()[-300:]}")
            break
        log(f"{name}: I/O floor, run {i + 1}")
        floor_runs.append(br.measure([sys.executable, HELPER, "floor", str(root), str(out_floor),
                                      "--like", str(out_vm / br.WEIGHTS)], mem_limit=cap))
    res["vecmerge"] = {"wall": min(r["wall"] for r in vm_runs), "peak": max(r["peak"] for r in vm_runs),
                       "rc": vm_runs[-1]["rc"], "walls": [r["wall"] for r in vm_runs],
                       "error": vm_runs[-1]["stderr"].strip()[-500:] if vm_runs[-1]["rc"] else None}
    if vm_runs[-1]["rc"] != 0:
        return res
    res["floor"] = {"wall": min(r["wall"] for r in floor_runs), "peak": max(r["peak"] for r in floor_runs),
                    "walls": [r["wall"] for r in floor_runs], **br.last_json(floor_runs[0])}
    man = br.manifest(out_vm)
    res["output_ranks"] = man["figures"]["rank"]
    if not big:
        log(f"{name}: vecmerge.merge.run in-process" + (" under cProfile" if a.profile else ""))
        prof = str(a.out / f"profile-{name}.txt") if a.profile else None
        cmd = [sys.executable, HELPER, "inproc", str(root), str(base / "out-inproc")] + (["--profile", prof]
                                                                                         if prof else [])
        r = br.measure(cmd)
        res["inproc"] = {**br.last_json(r), "process_peak": r["peak"]}
    sample = [m for m in shapes if m.startswith("model.layers.0.")]
    if not big and not a.no_dense:
        log(f"{name}: dense float64 reference on {len(sample)} modules of layer 0")
        r = br.measure([sys.executable, HELPER, "dense", str(root), str(out_vm), "--modules", *sample])
        per = br.last_json(r)
        res["dense"] = {"sampled": len(per), "peak": r["peak"], "modules": per,
                        "wall": per_type_total({m: e["seconds"] for m, e in per.items()}, shapes)}
    if not big and not a.no_peft:
        layers = a.peft_layers_8b if name == "llama3-8b" else (a.peft_layers or spec["layers"])
        layers = min(layers, spec["layers"])
        log(f"{name}: PEFT add_weighted_adapter svd + cat on a {layers}-layer model")
        r = br.measure([sys.executable, HELPER, "peft", str(root), str(out_vm), "--shape", name,
                        "--layers", str(layers), "--modules", *sample])
        p = br.last_json(r)
        scale = spec["layers"] / layers
        res["peft"] = {**p, "peak": r["peak"], "scale": scale, "svd_wall": p["svd_s"] * scale,
                       "cat_wall": p["cat_s"] * scale}
    return res


def ratio(x, y) -> str:
    return f"{x / y:,.1f}x" if x and y else "-"


def table(results: list, start: dict) -> str:
    head = ("| shape | measure | wall s | peak RSS MiB | time / floor | mem / floor | ref time / vecmerge "
            "(process; in-process) | max rel. Frobenius error vs ours |")
    rows = [head, "|" + "---|" * 8]
    for r in results:
        s, vm, fl = r["shape"], r["vecmerge"], r.get("floor")
        if vm["rc"] != 0:
            rows.append(f"| {s} | vecmerge project | FAILED (exit {vm['rc']}) | {vm['peak'] / MIB:,.0f} | | | | |")
            continue
        inp = r.get("inproc")
        rows.append(f"| {s} | I/O floor process (read 4 inputs, write output) | {fl['wall']:.2f} | "
                    f"{fl['peak'] / MIB:,.0f} | 1.0x | 1.0x | | |")
        rows.append(f"| {s} | **vecmerge project** process | {vm['wall']:.2f} | {vm['peak'] / MIB:,.0f} | "
                    f"{ratio(vm['wall'], fl['wall'])} | {ratio(vm['peak'], fl['peak'])} | | |")
        if inp:
            rows.append(f"| {s} | vecmerge `merge.run` in-process | {inp['wall']:.2f} | "
                        f"+{(inp['peak'] - inp['rss_before']) / MIB:,.0f} over imports | | | | |")

        def ref(label, wall, mem, err, s=s, fl=fl, vm=vm, inp=inp):
            return (f"| {s} | {label} | {wall:,.1f} | {mem} | {ratio(wall, fl['wall'])} | | "
                    f"{ratio(wall, vm['wall'])}; {ratio(wall, inp['wall'] if inp else 0)} | {err:.1e} |")

        if "dense" in r:
            d = r["dense"]
            rows.append(ref(f"dense f64 reference (extrapolated from {d['sampled']} modules)", d["wall"],
                            f"{d['peak'] / MIB:,.0f}", max(e["rel_err"] for e in d["modules"].values())))
        if "peft" in r:
            p = r["peft"]
            how = f"measured on {p['layers']} layer(s), x{p['scale']:g}" if p["scale"] != 1 else "all modules"
            for kind in ("svd", "cat"):
                extra = f"+{p[kind + '_extra_mem'] / MIB:,.0f} during merge"
                rank = f"rank {p['svd_rank']}" if kind == "svd" else "exact"
                rows.append(ref(f"PEFT `{kind}` merge call ({rank}; {how})", p[kind + "_wall"], extra,
                                max(e[kind] for e in p["modules"].values())))
    rows += ["", "| start-up (best of 5) | wall s | peak RSS MiB |", "|---|---|---|"]
    rows += [f"| `{k}` | {v['wall']:.3f} | {v['peak'] / MIB:,.0f} |" for k, v in start.items()]
    return "\n".join(rows)


def targets(results: list, start: dict) -> list[str]:
    lines = []
    by = {r["shape"]: r for r in results}
    r6 = by.get("qwen3-0.6b")
    if r6 and r6["vecmerge"]["rc"] == 0:
        q = r6["vecmerge"]["wall"] / r6["floor"]["wall"]
        lines.append(f"- 0.6B process within 2x of the I/O floor: {q:.2f}x -> {'met' if q <= 2 else 'MISSED'}")
    for name, need in (("qwen3-0.6b", 100), ("llama3-8b", 1000)):
        r = by.get(name)
        if r and "peft" in r:
            p, proc, inp = r["peft"]["svd_wall"], r["vecmerge"]["wall"], r["inproc"]["wall"]
            lines.append(f"- {name}: PEFT svd / vecmerge >= {need}x: whole process {p / proc:,.1f}x "
                         f"({'met' if p / proc >= need else 'MISSED'}), in-process merge.run {p / inp:,.1f}x "
                         f"({'met' if p / inp >= need else 'MISSED'})")
    for r in results:
        vm = r["vecmerge"]
        if vm["rc"] != 0:
            lines.append(f"- {r['shape']}: vecmerge did not complete: {vm['error']}")
            continue
        extra = vm["peak"] - r["baseline_rss"] - r["input_bytes"]
        mult = extra / r["largest_module"]
        lines.append(f"- {r['shape']}: peak {vm['peak'] / GIB:.2f} GiB = start-up {r['baseline_rss'] / GIB:.2f} + "
                     f"inputs {r['input_bytes'] / GIB:.2f} + {mult:,.0f} x largest module's factors "
                     f"({r['largest_module'] / MIB:.2f} MiB) -> {'met' if mult <= 8 else 'MISSED'} (budget 8x)")
        if r["shape"] == "llama3-70b":
            ok = vm["peak"] < 24 * GIB
            lines.append(f"- llama3-70b completes within 24 GiB: peak {vm['peak'] / GIB:.2f} GiB -> "
                         f"{'met' if ok else 'MISSED'}")
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
    p.add_argument("--profile", action="store_true", help="Run the in-process merge under cProfile.")
    p.add_argument("--keep", action="store_true", help="Keep the synthetic adapters for the next run.")
    a = p.parse_args(argv)
    names = ["qwen3-0.6b", "llama3-8b", "llama3-70b"]
    if a.quick:
        names, a.peft_layers = ["qwen3-0.6b"], a.peft_layers or 2
    if a.tiny:
        names, a.repeat = ["tiny"], 1
    if a.shapes:
        names = a.shapes.split(",")
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
    info["uptime_end"] = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    cmd = "python benchmarks/run.py " + " ".join(argv if argv is not None else sys.argv[1:])
    md = "\n".join([f"`{cmd.strip()}` on {info['date']}: {info['cpu']}, {info['nproc']} cores, torch "
                    f"{info['torch']}, peft {info['peft']}", f"load before: {info['uptime']}",
                    f"load after: {info['uptime_end']}", "", table(results, start), "", "Targets:",
                    *targets(results, start)])
    (a.out / "results.md").write_text(md + "\n")
    (a.out / "results.json").write_text(json.dumps({"machine": info, "startup": start, "results": results},
                                                   indent=2, default=str))
    print(md)
    log(f"done; results in {a.out / 'results.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
