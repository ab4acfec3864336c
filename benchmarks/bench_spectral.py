"""``make bench`` rows for the spectral merges: vecmerge's factored TSV-M, Iso-C, Iso-CTS, KnOTS-TIES and SVC against
their dense definitions, module by module, at Llama-3-8B shapes.

Inputs: three independent random LoRA adapters of rank 64 (``vecmerge.testing.toy_adapter``) on the modules
``--modules`` of one Llama-3-8B layer (default ``k_proj`` 1024 x 4096 and ``q_proj`` 4096 x 4096; ``up_proj``
14336 x 4096, which takes half an hour of dense SVDs: ``--modules k_proj,q_proj,up_proj``). Each measurement is
its own process on one thread (torch's and numpy's BLAS), its wall time around the call alone (imports
excluded; for ``factored`` reading the inputs included), with its peak RSS from ``wait4`` and the memory
growth during the call from ``VmHWM``:

- ``factored``: ``vecmerge.pipeline`` ``evaluate`` + ``build_output`` of the recipe on that one module (the
  shared basis, the method on the cores, the exact cut): what ``vecmerge merge`` does;
- ``dense``: the method's definition as the papers' code computes it, on the dense float64 updates (read
  with safetensors alone): ``tests/merge_references.py`` (numpy SVDs of (out, in) matrices; KnOTS's of the
  (out, 3 in) concatenation), the same code the tests check vecmerge against;
- ``check`` (untimed): the relative Frobenius distance between the two results.

Run alone: ``python benchmarks/bench_spectral.py [--modules k_proj,q_proj] [--bench-out bench-out/spectral]`` (about
20 minutes, most of it the dense SVDs); ``benchmarks/run.py`` runs it as part of ``make bench``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))
import bench_refs as br  # noqa: E402

SHAPE, RANK = "llama3-8b", 64
MODELS = ("a", "b", "c")
MODULES = ("self_attn.k_proj", "self_attn.q_proj")
ALL_MODULES = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
               "mlp.up_proj", "mlp.down_proj")
ONE_THREAD = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
METHODS = {  # label: (vecmerge recipe keys, the dense definition's name in merge_references)
    "tsv_m": ({"method": "tsv_m"}, "tsv_m"),
    "iso_c": ({"method": "iso_c"}, "iso_c"),
    "iso_cts": ({"method": "iso_cts"}, "iso_cts"),
    "knots ties": ({"method": "knots", "density": 0.5}, "knots"),
    "svc": ({"method": "svc"}, "svc"),
}
HELPER = str(Path(__file__).resolve())
MIB = 2**20


def make_data(root: Path, shape: str = SHAPE, rank: int = RANK) -> Path:
    """Three adapters of ``rank`` on layer 0 of ``shape`` (reused when present)."""
    from vecmerge.testing import toy_adapter

    stamp = root / "bench-stamp.json"
    want = json.dumps({"shape": shape, "rank": rank})
    if stamp.is_file() and stamp.read_text() == want:
        return root
    for i, n in enumerate(MODELS):
        toy_adapter(root / n, shapes=br.module_shapes(shape, 1), rank=rank, seed=100 + i)
    (root / "vecmerge.yaml").write_text("adapters:\n" + "".join(f"  {n}: {n}\n" for n in MODELS))
    stamp.write_text(want)
    return root


def factored(root: Path, out: Path, label: str, module: str) -> dict:
    import torch

    from vecmerge import Recipe, Workspace, evaluate

    # a building block timed on its own (internal): the pipeline's merge-and-cut stage
    from vecmerge.pipeline.build import build_output

    torch.set_num_threads(1)
    rec = Recipe.from_dict({**METHODS[label][0], "models": list(MODELS), "only": f"{module}$", "out": str(out)})
    before = br.rss()
    br.reset_peak()
    t0 = time.perf_counter()
    ev = evaluate(rec, Workspace(root=root))
    built = build_output(ev, 1.0)
    wall = time.perf_counter() - t0
    extra = max(br.rss("VmHWM") - before, 0)
    b = built.modules[f"model.layers.0.{module}"]
    W = b.written.lowrank
    torch.save({"B": W.B.double() * W.scale, "A": W.A.double()}, out.with_suffix(".pt"))
    return {"wall": wall, "extra_mem": extra, "rank": b.written.rank}


def dense(root: Path, out: Path, label: str, module: str) -> dict:
    import merge_references as mr
    import numpy as np
    import torch

    torch.set_num_threads(1)
    m = f"model.layers.0.{module}"
    Ds = [br.read_dense(root / n, m) for n in MODELS]
    before = br.rss()
    br.reset_peak()
    t0 = time.perf_counter()
    name = METHODS[label][1]
    if name == "knots":
        mu = _peft_merge_utils()
        T = mr.knots(mu, Ds, [1.0] * 3, 0.5, "ties")
    elif name == "svc":
        T = mr.svc(Ds, [1.0] * 3)
    else:
        T = getattr(mr, name)(Ds)
    wall = time.perf_counter() - t0
    extra = max(br.rss("VmHWM") - before, 0)
    np.save(out.with_suffix(".npy"), T.numpy())
    return {"wall": wall, "extra_mem": extra}


def _peft_merge_utils():
    """PEFT's ``merge_utils`` from its file alone (TIES for KnOTS, as the tests load it)."""
    import importlib.util

    spec = importlib.util.find_spec("peft")
    path = Path(spec.origin).parent / "utils" / "merge_utils.py"
    mod_spec = importlib.util.spec_from_file_location("_peft_merge_utils", path)
    mod = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(mod)
    return mod


def check(fact: Path, dens: Path) -> dict:
    import numpy as np
    import torch

    f = torch.load(fact.with_suffix(".pt"))
    W = f["B"] @ f["A"]
    T = torch.from_numpy(np.load(dens.with_suffix(".npy")))
    return {"rel": br.rel_err(W, T)}


def run_all(out: Path, modules=MODULES, log=print, env: dict | None = None) -> dict:
    root = out / "data"
    br.last_json(br.measure([sys.executable, HELPER, "data", str(root)]))
    res = {"shape": SHAPE, "rank": RANK, "rows": []}
    for module in modules:
        for label in METHODS:
            tag = f"{label.replace(' ', '-')}-{module.split('.')[-1]}"
            row = {"method": label, "module": module, "shape": br.module_shapes(SHAPE, 1)[f"model.layers.0.{module}"]}
            for kind in ("factored", "dense"):
                log(f"spectral: {label} on {module}: {kind}")
                r = br.measure([sys.executable, HELPER, kind, str(root), str(out / f"{tag}-{kind}"), "--label", label,
                                "--module", module], env={**ONE_THREAD, **(env or {})})
                row[kind] = {**br.last_json(r), "peak": r["peak"]}
            row["check"] = br.last_json(br.measure([sys.executable, HELPER, "check", str(out / f"{tag}-factored"),
                                                    str(out / f"{tag}-dense")]))
            res["rows"].append(row)
    return res


def rows(res: dict) -> list[str]:
    out = [f"Spectral merges at {res['shape']} shapes: 3 random LoRA adapters of rank {res['rank']}, one module per "
           "process, one thread; factored: vecmerge's evaluate + build (basis, method on the cores, exact cut); "
           "dense: the definition on dense float64 updates (numpy SVDs, as the papers' code).", "",
           "| method | module (out x in) | factored s | dense s | dense / factored | factored call MiB "
           "| dense call MiB | dense / factored memory | peak RSS MiB factored / dense | rank "
           "| factored vs dense (rel.) |",
           "|" + "---|" * 11]
    for r in res["rows"]:
        f, d = r["factored"], r["dense"]
        fm, dm = max(f["extra_mem"], MIB), max(d["extra_mem"], MIB)
        out.append(f"| {r['method']} | {r['module'].split('.')[-1]} ({r['shape'][0]} x {r['shape'][1]}) | "
                   f"{f['wall']:.3f} | {d['wall']:.1f} | {d['wall'] / f['wall']:,.0f}x | {fm / MIB:,.0f} | "
                   f"{dm / MIB:,.0f} | {dm / fm:,.0f}x | {f['peak'] / MIB:,.0f} / {d['peak'] / MIB:,.0f} | "
                   f"{f['rank']} | {r['check']['rel']:.1e} |")
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", nargs="?", default="all", choices=["all", "data", "factored", "dense", "check"])
    p.add_argument("root", nargs="?", type=Path)
    p.add_argument("out", nargs="?", type=Path)
    p.add_argument("--label", default="tsv_m", choices=list(METHODS))
    p.add_argument("--module", default=MODULES[0])
    p.add_argument("--modules", default=",".join(MODULES), help="comma-separated modules of one layer")
    p.add_argument("--bench-out", type=Path, default=Path("bench-out/spectral"))
    a = p.parse_args(argv)
    if a.mode == "all":
        out = a.bench_out.resolve()
        out.mkdir(parents=True, exist_ok=True)
        mods = tuple(next(x for x in ALL_MODULES if x.endswith(m)) for m in a.modules.split(","))
        res = run_all(out, mods, log=lambda s: print(s, file=sys.stderr, flush=True))
        (out / "results.json").write_text(json.dumps(res, indent=2))
        print("\n".join(rows(res)))
        return 0
    if a.mode == "data":
        res = {"root": str(make_data(a.root))}
    elif a.mode == "factored":
        res = factored(a.root, a.out, a.label, a.module)
    elif a.mode == "dense":
        res = dense(a.root, a.out, a.label, a.module)
    else:
        res = check(a.root, a.out)
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
