"""Building blocks of ``make bench``: synthetic adapters, measured subprocesses, and the references.

Run as a script, it is one of the processes the benchmark times; each prints one JSON line:

    python benchmarks/bench_refs.py data   ROOT - --shape S           # write (or reuse) the inputs
    python benchmarks/bench_refs.py floor  ROOT OUT --like F         # I/O floor: read inputs, write OUT
    python benchmarks/bench_refs.py inproc ROOT OUT [--profile F]    # vecmerge.pipeline.run, timed in-process
    python benchmarks/bench_refs.py dense  ROOT OUT --modules M..    # dense DeltaW + torch.linalg.svd
    python benchmarks/bench_refs.py peft   ROOT OUT --shape S --layers N [--modules M..]

ROOT holds v28, v51, v54e2, v54 and vecmerge.yaml (``make_data``); OUT is vecmerge's output folder.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SHAPES = {  # module shapes (q/k/v/o/gate/up/down of every layer) and LoRA rank
    "qwen3-0.6b": dict(layers=28, hidden=1024, intermediate=3072, heads=16, kv_heads=8, head_dim=128, r=32),
    "llama3-8b": dict(layers=32, hidden=4096, intermediate=14336, heads=32, kv_heads=8, head_dim=128, r=64),
    "llama3-70b": dict(layers=80, hidden=8192, intermediate=28672, heads=64, kv_heads=8, head_dim=128, r=16),
    "tiny": dict(layers=2, hidden=64, intermediate=96, heads=4, kv_heads=2, head_dim=16, r=8),
}
INPUTS = ("v54", "v51", "v28", "v54e2")  # what the v58 step reads
TRUST = 0.0113
# Later checkpoints move every factor a little, as training does (toy_trajectory factor_noise): exactly repeated
# factors would make the stacks rank-deficient, which trained adapters never are (see BENCHMARKS.md).
FACTOR_NOISE = 0.02
WEIGHTS = "adapter_model.safetensors"
PREFIX = "base_model.model."


def module_shapes(name: str, layers: int | None = None) -> dict:
    """``{module: (out, in)}`` as ``vecmerge.testing.llm_shapes`` gives them (without importing torch)."""
    s = SHAPES[name]
    h, d = s["hidden"], s["head_dim"]
    q, kv, inter = s["heads"] * d, s["kv_heads"] * d, s["intermediate"]
    per = {"self_attn.q_proj": (q, h), "self_attn.k_proj": (kv, h), "self_attn.v_proj": (kv, h),
           "self_attn.o_proj": (h, q), "mlp.gate_proj": (inter, h), "mlp.up_proj": (inter, h),
           "mlp.down_proj": (h, inter)}
    return {f"model.layers.{i}.{k}": v for i in range(layers or s["layers"]) for k, v in per.items()}


def make_data(root: Path, name: str, seed: int = 0) -> Path:
    """Write (or reuse) the v28/v51/v54e2/v54 trajectory of rank ``r`` at the shapes of ``name``."""
    from vecmerge.testing import llm_shapes, toy_trajectory

    stamp = root / "bench-stamp.json"
    want = json.dumps({"shape": SHAPES[name], "seed": seed, "factor_noise": FACTOR_NOISE})
    if stamp.is_file() and stamp.read_text() == want:
        return root
    shutil.rmtree(root, ignore_errors=True)
    s = SHAPES[name]
    shapes = llm_shapes(s["layers"], s["hidden"], s["intermediate"], s["heads"], s["kv_heads"], s["head_dim"])
    toy_trajectory(root, shapes=shapes, rank=s["r"] // 2, seed=seed, factor_noise=FACTOR_NOISE)
    stamp.write_text(want)
    return root


DEVICE = "cpu"  # --device of every vecmerge process timed (run.py --device)


def vecmerge_exe() -> list[str]:
    """The ``vecmerge`` console script beside this Python, or the CLI through ``-c`` where none is installed
    (a machine that runs the tree from PYTHONPATH)."""
    exe = Path(sys.executable).with_name("vecmerge")
    return [str(exe)] if exe.is_file() else [sys.executable, "-c", "from vecmerge.cli import main; main()"]


def project_cmd(out, device: str | None = None) -> list[str]:
    """The v58 step as a user types it (run in ROOT, where vecmerge.yaml lives)."""
    return [*vecmerge_exe(), "--quiet", "--device", device or DEVICE, "project", "--base", "v54", "--dir",
            "v51-v28", "--trust", str(TRUST), "--consensus-ref", "v54-v54e2", "--out", str(out), "--force"]


def verify_cmd(out, device: str | None = None) -> list[str]:
    """``vecmerge verify`` of the step's output (re-derives it from the manifest: the same work again, checked)."""
    return [*vecmerge_exe(), "--quiet", "--device", device or DEVICE, "verify", str(out)]


def audit_cmd() -> list[str]:
    """``vecmerge audit`` of the step's two trajectories (run in ROOT)."""
    return [*vecmerge_exe(), "--quiet", "--device", DEVICE, "audit", "--ref", "v54-v54e2", "--dir", "v51-v28",
            "--format", "json"]


def measure(cmd: list[str], cwd=None, mem_limit: int | None = None, env: dict | None = None,
            timeout: float | None = None) -> dict:
    """Run ``cmd``; wall time, peak RSS (bytes, from wait4's rusage), exit code and output.

    ``mem_limit`` caps the address space (through ``prlimit``, so the child is spawned without a
    fork of this process, whose pages would otherwise count in the child's peak RSS). Past
    ``timeout`` seconds the child is killed and ``timed_out`` is set.
    """
    if mem_limit:
        cmd = ["prlimit", f"--as={mem_limit}", "--", *cmd]
    full_env = {**os.environ, **(env or {})}
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        p = subprocess.Popen(cmd, cwd=cwd, stdout=out, stderr=err, env=full_env)
        timed_out = False
        while True:
            pid, status, ru = os.wait4(p.pid, os.WNOHANG)
            if pid:
                break
            if timeout and time.perf_counter() - t0 > timeout and not timed_out:
                p.kill()  # the child we started, by its pid
                timed_out = True
            time.sleep(0.05)
        wall = time.perf_counter() - t0
        p.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return {"wall": wall, "peak": ru.ru_maxrss * 1024, "cpu": ru.ru_utime + ru.ru_stime, "rc": p.returncode,
                "timed_out": timed_out,
                "stdout": out.read().decode(errors="replace"), "stderr": err.read().decode(errors="replace")}


def last_json(res: dict) -> dict:
    """The JSON line a helper subprocess printed last; raise with its stderr if it failed."""
    if res["rc"] != 0:
        raise RuntimeError(f"exit {res['rc']}: {res['stderr'][-2000:]}")
    return json.loads(res["stdout"].strip().splitlines()[-1])


# -- in-process memory: VmHWM reset through clear_refs (Linux) ----------------------------------
def reset_peak() -> None:
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def rss(field: str = "VmRSS") -> int:
    """Current (VmRSS) or peak since reset (VmHWM) resident memory, bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    return 0


# -- reading factors without vecmerge (an independent reader for the references) ----------------
def read_dense(folder: Path, module: str):
    """``scale * B @ A`` of one module in float64, scale by PEFT's rule (first matching pattern)."""
    from safetensors import safe_open

    cfg = json.loads((folder / "adapter_config.json").read_text())
    with safe_open(str(folder / WEIGHTS), framework="pt") as f:
        A = f.get_tensor(f"{PREFIX}{module}.lora_A.weight").double()
        B = f.get_tensor(f"{PREFIX}{module}.lora_B.weight").double()
    alpha = cfg["lora_alpha"]
    for key, val in (cfg.get("alpha_pattern") or {}).items():
        if re.match(rf"(.*\.)?({key})$", module):
            alpha = val
            break
    r = A.shape[0]
    scale = alpha / r ** 0.5 if cfg.get("use_rslora") else alpha / r
    return scale * (B @ A)


def rel_err(x, ref) -> float:
    import torch

    return float(torch.linalg.norm(x - ref) / torch.linalg.norm(ref))


def manifest(out: Path) -> dict | None:
    """vecmerge's manifest of ``out``, or None when vecmerge wrote nothing (it failed or timed out)."""
    p = Path(out) / "vecmerge.json"
    return json.loads(p.read_text()) if p.is_file() else None


def step_of(out: Path, shape: str) -> tuple[float, dict | None, int]:
    """(alpha, per-module ranks or None, max rank) of our output; without one, a nominal step of the
    trajectory's exact rank 3r/2 (the references are then timed, not compared)."""
    man = manifest(out)
    if man is None:
        return 0.05, None, 3 * SHAPES[shape]["r"] // 2
    ranks = {m: e["rank"] for m, e in man["modules"].items()}
    return man["resolved"]["alpha"], ranks, max(ranks.values())


# -- the references -------------------------------------------------------------------------
def dense_reference(root: Path, out: Path, modules: list[str], shape: str = "qwen3-0.6b") -> dict:
    """The same v58 step with dense matrices, per sampled module, and its agreement with ``out``.

    Timed per module (after one untimed warm-up pass on the first): the four dense updates, both
    differences, inner product and norms (the audit), the dense step, ``torch.linalg.svd`` and the
    cut at our output's rank. Alpha is ours (global).
    """
    import torch

    alpha, ranks, kmax = step_of(out, shape)
    res = {}
    for i, m in enumerate([modules[0], *modules] if modules else []):  # the first pass warms up, untimed
        t0 = time.perf_counter()
        W = {n: read_dense(root / n, m) for n in INPUTS}
        ref, d = W["v54"] - W["v54e2"], W["v51"] - W["v28"]
        _ = float((ref * d).sum()), float(torch.linalg.norm(ref)), float(torch.linalg.norm(d))
        target = W["v54"] + alpha * d
        U, S, Vh = torch.linalg.svd(target, full_matrices=False)
        k = ranks[m] if ranks else kmax
        root_s = S[:k].sqrt()
        B, A = U[:, :k] * root_s, root_s[:, None] * Vh[:k]
        seconds = time.perf_counter() - t0
        if i == 0:
            continue
        res[m] = {"seconds": seconds, "rank": k, "cut_err": rel_err(B @ A, target),
                  "rel_err": rel_err(read_dense(out, m), B @ A) if ranks else None}
        del W, ref, d, target, U, S, Vh
    return res


def build_model(shape: str, layers: int):
    """A random-free base model of ``shape`` with ``layers`` layers: built on meta, then left uninitialised."""
    import torch

    s = SHAPES[shape]
    kw = dict(vocab_size=128, hidden_size=s["hidden"], intermediate_size=s["intermediate"], num_hidden_layers=layers,
              num_attention_heads=s["heads"], num_key_value_heads=s["kv_heads"], head_dim=s["head_dim"],
              max_position_embeddings=128, tie_word_embeddings=True)
    if shape.startswith("llama"):
        from transformers import LlamaConfig as Config
        from transformers import LlamaForCausalLM as Model
    else:
        from transformers import Qwen3Config as Config
        from transformers import Qwen3ForCausalLM as Model
    with torch.device("meta"):
        model = Model(Config(**kw))
    return model.to_empty(device="cpu")  # weights are never read by add_weighted_adapter


def peft_reference(root: Path, out: Path, shape: str, layers: int, modules: list[str]) -> dict:
    """PEFT ``add_weighted_adapter`` (svd at our output's rank, and cat) on a ``layers``-layer model."""
    import gc
    import logging
    import warnings

    import torch
    from peft import PeftModel

    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    alpha, ranks, k = step_of(out, shape)
    model = build_model(shape, layers)
    t0 = time.perf_counter()
    pm = PeftModel.from_pretrained(model, str(root / "v54"), adapter_name="v54")
    for n in ("v51", "v28"):
        pm.load_adapter(str(root / n), adapter_name=n)
    res = {"load_s": time.perf_counter() - t0, "layers": layers, "svd_rank": k}
    for kind in ("svd", "cat"):
        gc.collect()
        before = rss()
        reset_peak()
        t0 = time.perf_counter()
        with torch.no_grad():
            pm.add_weighted_adapter(["v54", "v51", "v28"], [1.0, alpha, -alpha], f"m_{kind}", combination_type=kind,
                                    svd_rank=k if kind == "svd" else None)
        res[f"{kind}_s"] = time.perf_counter() - t0
        res[f"{kind}_extra_mem"] = max(rss("VmHWM") - before, 0)
    res["modules"] = {}
    with torch.no_grad():
        for m in modules if ranks else []:
            layer = pm.base_model.model.get_submodule(m)
            ours = read_dense(out, m)
            res["modules"][m] = {kind: rel_err(layer.get_delta_weight(f"m_{kind}").double(), ours)
                                 for kind in ("svd", "cat")}
    return res


def floor(root: Path, out: Path, like: Path, rank_factor: float = 1.0) -> dict:
    """Read every input fully and write a file with the tensor shapes of ``like`` (vecmerge's output,
    or an input with its rank multiplied by ``rank_factor``)."""
    import torch
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    held = [load_file(str(root / n / WEIGHTS)) for n in INPUTS]
    with safe_open(str(like), framework="pt") as f:
        shapes = {key: f.get_slice(key).get_shape() for key in f.keys()}
    for key, (rows, cols) in shapes.items():
        a_side = ".lora_A." in key
        r = round((rows if a_side else cols) * rank_factor)
        shapes[key] = (r, cols) if a_side else (rows, r)
    tensors = {key: torch.full(shape, 1.0) for key, shape in shapes.items()}
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / WEIGHTS), metadata={"format": "pt"})
    return {"read": sum(t.numel() * t.element_size() for sd in held for t in sd.values()),
            "written": (out / WEIGHTS).stat().st_size}


def inproc(root: Path, out: Path, profile: str | None = None) -> dict:
    """``vecmerge.pipeline.run`` of the v58 step, timed inside one process (imports excluded)."""
    from vecmerge import Recipe, Workspace, run

    recipe = Recipe.from_dict({"base": "v54", "dir": "v51-v28", "trust": TRUST, "out": str(out),
                               "consensus": {"ref": "v54-v54e2", "on_disagree": "fail"}}, "bench")
    before = rss()
    reset_peak()
    t0 = time.perf_counter()
    if profile:
        import cProfile
        import io
        import pstats

        prof = cProfile.Profile()
        rep = prof.runcall(run, recipe, Workspace(root=root), force=True)
        wall = time.perf_counter() - t0
        buf = io.StringIO()
        stats = pstats.Stats(prof, stream=buf)
        stats.sort_stats("tottime").print_stats(25)
        stats.sort_stats("cumulative").print_stats(40)
        Path(profile).write_text(buf.getvalue())
    else:
        rep = run(recipe, Workspace(root=root), force=True)
        wall = time.perf_counter() - t0
    return {"wall": wall, "rss_before": before, "peak": rss("VmHWM"), "alpha": rep.step.alpha}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", choices=["data", "floor", "inproc", "dense", "peft"])
    p.add_argument("root", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--like", type=Path, help="floor: the file whose tensor shapes to write")
    p.add_argument("--rank-factor", type=float, default=1.0, help="floor: multiply the rank of --like")
    p.add_argument("--modules", nargs="*", default=[])
    p.add_argument("--shape", default="qwen3-0.6b")
    p.add_argument("--layers", type=int, default=1)
    p.add_argument("--profile")
    a = p.parse_args(argv)
    if a.mode == "data":
        res = {"root": str(make_data(a.root, a.shape))}
    elif a.mode == "floor":
        res = floor(a.root, a.out, a.like, a.rank_factor)
    elif a.mode == "inproc":
        res = inproc(a.root, a.out, a.profile)
    elif a.mode == "dense":
        res = dense_reference(a.root, a.out, a.modules, a.shape)
    else:
        res = peft_reference(a.root, a.out, a.shape, a.layers, a.modules)
    print(json.dumps(res))


if __name__ == "__main__":
    main()
