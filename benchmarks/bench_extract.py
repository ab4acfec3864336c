"""``make bench`` (second part): ``vecmerge extract`` and ``vecmerge fuse`` at real model shapes.

Synthetic full weights (bf16, safetensors, sharded with an index like a hub checkpoint): for every
q/k/v/o/gate/up/down module ``W_base ~ N(0, 0.02^2)`` and ``W_tuned = bf16(W_base + L + N)``, L a rank-16
change of norm ``0.02 ||W||`` (singular values decaying 0.85^i) and N iid noise of norm ``0.005 ||W||``
(plus bf16's own rounding); norms and embeddings are equal in both (nothing else differs). Shapes:

- ``qwen3-0.6b``: hidden 1024, intermediate 3072, 16/8 heads of 128, vocabulary 151936, rank 32;
- ``llama-3-8b``: hidden 4096, intermediate 14336, 32/8 heads of 128, vocabulary 128256, rank 64.

Only ``--layers`` of the model's layers are written (default 4 and 2: the machine has 2 cores and 24 GiB
shared); per-layer figures are extrapolated to all layers (28 and 32) and the table says which are. Measured,
each as its own process (wall time and peak RSS from ``wait4``):

- ``vecmerge extract --rank R`` on the sample; its manifest gives each module's exact relative error;
- the reference: ``mergekit-extract-lora --max-rank R`` on the same files where it is installed (``--mergekit``
  or ``$MERGEKIT_EXTRACT_LORA``, e.g. from a throwaway venv), else a dense full SVD (``torch.linalg.svd`` of the
  float32 difference, what mergekit runs) timed on one module per shape class; the same SVD's singular values
  give the optimal (Eckart-Young) error to compare ours with;
- ``vecmerge fuse`` of the extracted adapter into the sampled base, against a plain read-and-write of the
  same shards (safetensors ``load_file`` + ``save_file`` per shard, then fsync, as the fuse's commit does);
- start-up: ``python -c 'import vecmerge.models.extract_write, vecmerge.models.fuse'`` (peak RSS = the baseline that
  "memory above start-up" subtracts).

Writes ``OUT/results.json`` and ``OUT/results.md`` (default ``OUT = bench-out/extract``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_refs as br  # noqa: E402

HELPER = str(Path(__file__).resolve())
GIB = 2**30
SHAPES = {
    "qwen3-0.6b": dict(hidden=1024, inter=3072, heads=16, kv=8, head_dim=128, vocab=151936, layers=28, rank=32,
                       sample=4),
    "llama-3-8b": dict(hidden=4096, inter=14336, heads=32, kv=8, head_dim=128, vocab=128256, layers=32, rank=64,
                       sample=2),
}


def log(msg: str) -> None:
    print(f"[bench-extract] {msg}", file=sys.stderr, flush=True)


def module_shapes(s: dict) -> dict:
    h, q, kv = s["hidden"], s["heads"] * s["head_dim"], s["kv"] * s["head_dim"]
    return {"self_attn.q_proj": (q, h), "self_attn.k_proj": (kv, h), "self_attn.v_proj": (kv, h),
            "self_attn.o_proj": (h, q), "mlp.gate_proj": (s["inter"], h), "mlp.up_proj": (s["inter"], h),
            "mlp.down_proj": (h, s["inter"])}


# -- data -----------------------------------------------------------------------------------------
def make_data(root: Path, shape: str, layers: int, seed: int = 0) -> None:
    """Write ``root/base`` and ``root/tuned`` (see the module docstring); reuse them if complete."""
    import torch

    # a building block (internal): vecmerge's streaming safetensors writer makes the large test models
    from vecmerge.io.safetensors_write import SafetensorsWriter, write_index

    stamp = root / f"done-{shape}-{layers}"
    if stamp.is_file():
        return
    shutil.rmtree(root, ignore_errors=True)
    s = SHAPES[shape]
    g = torch.Generator().manual_seed(seed)
    shards = [[("model.embed_tokens.weight", (s["vocab"], s["hidden"]))]]
    for i in range(layers):
        shards.append([(f"model.layers.{i}.{k}.weight", v) for k, v in module_shapes(s).items()]
                      + [(f"model.layers.{i}.input_layernorm.weight", (s["hidden"],)),
                         (f"model.layers.{i}.post_attention_layernorm.weight", (s["hidden"],))])
    shards.append([("model.norm.weight", (s["hidden"],)), ("lm_head.weight", (s["vocab"], s["hidden"]))])
    for side in ("base", "tuned"):
        (root / side).mkdir(parents=True)
        (root / side / "config.json").write_text(json.dumps({
            "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": s["hidden"],
            "intermediate_size": s["inter"], "num_attention_heads": s["heads"], "num_key_value_heads": s["kv"],
            "head_dim": s["head_dim"], "num_hidden_layers": layers, "vocab_size": s["vocab"],
            "tie_word_embeddings": False, "torch_dtype": "bfloat16"}))
    wmap, total = {}, 0
    for j, entries in enumerate(shards):
        fname = f"model-{j + 1:05d}-of-{len(shards):05d}.safetensors"
        ws = {side: SafetensorsWriter(root / side / fname, [(n, "BF16", sh) for n, sh in entries], {"format": "pt"})
              for side in ("base", "tuned")}
        for name, sh in entries:
            if len(sh) == 1:
                w = torch.ones(sh)
                t = w
            else:
                w = 0.02 * torch.randn(*sh, generator=g)
                t = w
                if "embed" not in name and "lm_head" not in name:
                    m, n = sh
                    r = 16
                    U = torch.linalg.qr(torch.randn(m, r, generator=g)).Q
                    V = torch.linalg.qr(torch.randn(n, r, generator=g)).Q
                    sv = torch.tensor([0.85**i for i in range(r)])
                    sv = sv / sv.norm() * 0.02 * float(w.norm())
                    noise = torch.randn(m, n, generator=g)
                    t = w + (U * sv) @ V.T + noise * (0.005 * float(w.norm()) / float(noise.norm()))
            ws["base"].write(name, w.bfloat16())
            ws["tuned"].write(name, t.bfloat16())
            wmap[name] = fname
            total += math.prod(sh) * 2
        for w in ws.values():
            w.close()
    for side in ("base", "tuned"):
        write_index(root / side / "model.safetensors.index.json", wmap, total)
    stamp.write_text("ok")


# -- the dense reference and the plain read+write ---------------------------------------------------
def reference(root: Path, names: list[str], rank: int) -> dict:
    """Per module: seconds of ``torch.linalg.svd`` of the float32 difference, and the optimal relative error."""
    import torch

    # a building block (internal): the checked reader of a model folder's shards
    from vecmerge.io.model_folder import ModelFolder

    out = {}
    torch.linalg.svd(torch.randn(256, 128), full_matrices=False)  # untimed warm-up (LAPACK start-up)
    with ModelFolder(root / "base") as b, ModelFolder(root / "tuned") as t:
        for name in names:
            D64 = t.read(name).double() - b.read(name).double()
            total = float((D64 * D64).sum())
            D = D64.float()
            del D64
            t0 = time.perf_counter()
            _, S, _ = torch.linalg.svd(D, full_matrices=False)
            sec = time.perf_counter() - t0
            kept = float((S[:rank].double() ** 2).sum())
            out[name] = {"seconds": sec, "optimal_rel_error": math.sqrt(max(total - kept, 0.0) / total)}
            log(f"  dense SVD {name} {tuple(D.shape)}: {sec:.1f} s")
    return out


def adapter_errors(root: Path, adapter: Path, names: list[str]) -> dict:
    """``||D - W|| / ||D||`` of an adapter's modules (W as PEFT scales it; read by vecmerge.peft.adapter)."""
    import torch

    from vecmerge import Adapter

    # a building block (internal): the checked reader of a model folder's shards
    from vecmerge.io.model_folder import ModelFolder

    a = Adapter(adapter, modules_to_save="drop")
    out = {}
    with ModelFolder(root / "base") as b, ModelFolder(root / "tuned") as t:
        for name in names:
            m = name.removesuffix(".weight")
            D = t.read(name).double() - b.read(name).double()
            W = a.factors(m).dense().double()
            out[name] = float(torch.linalg.vector_norm(D - W) / torch.linalg.vector_norm(D))
    return out


def plain_copy(src: Path, dst: Path, hashed: bool = False) -> dict:
    """Read every shard with safetensors and write it again (and the index), then fsync: the I/O floor.

    With ``hashed``, also the sha256 of every input and output shard (two threads), as fuse records them.
    """
    import hashlib
    import threading

    from safetensors.torch import load_file, save_file

    shutil.rmtree(dst, ignore_errors=True)
    dst.mkdir(parents=True)
    n = 0
    for p in sorted(src.glob("*.safetensors")):
        sd = load_file(str(p))
        save_file(sd, str(dst / p.name), metadata={"format": "pt"})
        n += (dst / p.name).stat().st_size
        del sd
    for p in src.glob("*.json"):
        shutil.copyfile(p, dst / p.name)
    for p in dst.iterdir():
        fd = os.open(p, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
    if hashed:
        def digest(folder):
            for p in sorted(folder.glob("*.safetensors")):
                h = hashlib.sha256()
                with open(p, "rb") as f:
                    for chunk in iter(lambda: f.read(1 << 24), b""):
                        h.update(chunk)

        threads = [threading.Thread(target=digest, args=(d,)) for d in (src, dst)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    return {"bytes": n}


# -- one shape ------------------------------------------------------------------------------------
def vm(*args) -> list[str]:
    return [str(Path(sys.executable).with_name("vecmerge")), "--quiet", *map(str, args)]


def bench_shape(shape: str, a) -> dict:
    s = SHAPES[shape]
    L = a.layers.get(shape, s["sample"])
    root = a.out / shape
    data = root / "data"
    log(f"{shape}: writing/reusing {L} layers of synthetic base and fine-tune under {data}")
    br.last_json(br.measure([sys.executable, HELPER, "data", str(data), shape, str(L)]))
    scale = s["layers"] / L
    res = {"shape": shape, "spec": s, "layers_sampled": L, "layers_full": s["layers"], "scale": scale}
    py = [sys.executable, "-c", "import vecmerge.models.extract_write, vecmerge.models.fuse"]
    res["startup"] = min((br.measure(py) for _ in range(3)), key=lambda r: r["wall"])
    out = root / "lora"
    log(f"{shape}: vecmerge extract --rank {s['rank']}")
    r = br.measure(vm("extract", "--base-model", data / "base", "--tuned", data / "tuned", "--rank", s["rank"],
                      "--out", out, "--force"))
    if r["rc"]:
        raise RuntimeError(r["stderr"][-2000:])
    man = json.loads((out / "vecmerge.json").read_text())
    res["extract"] = {"wall": r["wall"], "peak": r["peak"], "module_seconds": sum(m["seconds"] for m in
                                                                                  man["modules"].values()),
                      "rel_error": {m: x["rel_error"] for m, x in man["modules"].items()},
                      "method": sorted({x["method"] for x in man["modules"].values()})}
    by_shape = {}
    for k, sh in module_shapes(s).items():  # one module per shape class (m x n and n x m alike), from layer 0
        by_shape.setdefault(tuple(sorted(sh)), f"model.layers.0.{k}.weight")
    ref_names = list(by_shape.values()) if not a.all_reference else \
        [f"model.layers.0.{k}.weight" for k in module_shapes(s)]
    log(f"{shape}: dense full-SVD reference on {len(ref_names)} modules")
    res["reference"] = br.last_json(br.measure([sys.executable, HELPER, "reference", str(data), str(s["rank"]),
                                                *ref_names]))
    mk = a.mergekit or os.environ.get("MERGEKIT_EXTRACT_LORA") or shutil.which("mergekit-extract-lora")
    if mk and shape in a.mergekit_shapes:
        log(f"{shape}: mergekit-extract-lora --max-rank {s['rank']} ({mk})")
        mo = root / "mergekit"
        shutil.rmtree(mo, ignore_errors=True)
        r = br.measure([mk, "--model", str((data / "tuned").resolve()), "--base-model", str((data / "base").resolve()),
                        "--out-path", str(mo.resolve()), "--max-rank", str(s["rank"]), "--quiet"],
                       env={"HF_HUB_OFFLINE": "1"}, timeout=a.timeout)
        res["mergekit"] = {"wall": r["wall"], "peak": r["peak"], "rc": r["rc"], "timed_out": r["timed_out"]}
        if r["rc"] == 0:
            res["mergekit"]["rel_error"] = br.last_json(br.measure([sys.executable, HELPER, "errors", str(data),
                                                                    str(mo), *ref_names]))
        else:
            res["mergekit"]["error"] = r["stderr"][-800:]
    fused, fuses, copies, hashed = root / "fused", [], [], []
    for i in range(a.repeat):  # alternating, so that none gets the warmer page cache
        log(f"{shape}: plain read+write, the same with sha256, then vecmerge fuse (round {i + 1} of {a.repeat})")
        copies.append(br.measure([sys.executable, HELPER, "copy", str(data / "base"), str(root / "copy")]))
        shutil.rmtree(root / "copy", ignore_errors=True)
        hashed.append(br.measure([sys.executable, HELPER, "copy", str(data / "base"), str(root / "copy"), "--hash"]))
        shutil.rmtree(root / "copy", ignore_errors=True)
        r = br.measure(vm("fuse", out, "--base-model", data / "base", "--out", fused, "--force"))
        if r["rc"]:
            raise RuntimeError(r["stderr"][-2000:])
        fuses.append(r)
        shutil.rmtree(fused, ignore_errors=True)
    for key, runs in (("fuse", fuses), ("copy", copies), ("copy_hashed", hashed)):
        res[key] = {"wall": min(r["wall"] for r in runs), "walls": [r["wall"] for r in runs],
                    "cpu": min(r["cpu"] for r in runs), "peak": max(r["peak"] for r in runs)}
    return res


def per_type_reference_seconds(res: dict) -> float:
    """The dense reference extrapolated to every module of the full model: each type at its shape's time."""
    s = res["spec"]
    ms = module_shapes(s)
    sec = {tuple(sorted(ms[n.split(".", 3)[3].removesuffix(".weight")])): v["seconds"]
           for n, v in res["reference"].items()}
    return s["layers"] * sum(sec[tuple(sorted(sh))] for sh in ms.values())


def render(results: list) -> str:
    gb = lambda b: f"{b / GIB:.2f}"  # noqa: E731
    lines = ["| shape | layers timed | vecmerge extract s (all layers) | reference | reference s (all layers) "
             "| speed-up | peak above start-up GiB | worst error vs optimal | fuse s / read+write s (CPU s) "
             "| read+write+sha256 s |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        sc, ex = r["scale"], r["extract"]
        ours_all = ex["wall"] * sc
        ref_all = per_type_reference_seconds(r)
        ratios = [ex["rel_error"][n.removesuffix(".weight")] / v["optimal_rel_error"]
                  for n, v in r["reference"].items()]
        mk = r.get("mergekit")
        ref_name = "dense fp32 SVD (sampled modules)"
        if mk and mk.get("rc") == 0:
            ref_name += f"; mergekit {mk['wall'] * sc:.0f} s extrapolated"
        lines.append(f"| {r['shape']} | {r['layers_sampled']}/{r['layers_full']} | {ex['wall']:.1f} ({ours_all:.0f}) "
                     f"| {ref_name} | {ref_all:.0f} | {ref_all / ours_all:.1f}x | "
                     f"{gb(ex['peak'] - r['startup']['peak'])} | {max(ratios) - 1:+.3%} | "
                     f"{r['fuse']['wall']:.1f} / {r['copy']['wall']:.1f} = "
                     f"{r['fuse']['wall'] / r['copy']['wall']:.2f} ({r['fuse']['cpu']:.1f} / {r['copy']['cpu']:.1f}) | "
                     f"{r['copy_hashed']['wall']:.1f} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd")
    d = sub.add_parser("data")
    d.add_argument("root", type=Path)
    d.add_argument("shape")
    d.add_argument("layers", type=int)
    rf = sub.add_parser("reference")
    rf.add_argument("root", type=Path)
    rf.add_argument("rank", type=int)
    rf.add_argument("names", nargs="+")
    er = sub.add_parser("errors")
    er.add_argument("root", type=Path)
    er.add_argument("adapter", type=Path)
    er.add_argument("names", nargs="+")
    cp = sub.add_parser("copy")
    cp.add_argument("src", type=Path)
    cp.add_argument("dst", type=Path)
    cp.add_argument("--hash", action="store_true")
    p.add_argument("--out", type=Path, default=Path("bench-out/extract"))
    p.add_argument("--shapes", default="qwen3-0.6b,llama-3-8b")
    p.add_argument("--layers", default="", help="e.g. qwen3-0.6b=4,llama-3-8b=2 (layers written and timed)")
    p.add_argument("--mergekit", default=None, help="path of mergekit-extract-lora (default: $MERGEKIT_EXTRACT_LORA "
                   "or PATH)")
    p.add_argument("--mergekit-shapes", default="qwen3-0.6b", help="shapes to run mergekit on (it runs a full SVD "
                   "of every module: hours at 8B on 2 cores)")
    p.add_argument("--all-reference", action="store_true", help="reference SVD of all of layer 0's modules")
    p.add_argument("--timeout", type=float, default=1800)
    p.add_argument("--repeat", type=int, default=3, help="fuse and read+write rounds (best of)")
    a = p.parse_args(argv)
    if a.cmd == "data":
        make_data(a.root, a.shape, a.layers)
        print(json.dumps({"ok": True}))
        return
    if a.cmd == "reference":
        print(json.dumps(reference(a.root, a.names, a.rank)))
        return
    if a.cmd == "errors":
        print(json.dumps(adapter_errors(a.root, a.adapter, a.names)))
        return
    if a.cmd == "copy":
        print(json.dumps(plain_copy(a.src, a.dst, a.hash)))
        return
    a.layers = {k: int(v) for k, v in (x.split("=") for x in a.layers.split(",") if x)}
    a.mergekit_shapes = a.mergekit_shapes.split(",")
    a.out.mkdir(parents=True, exist_ok=True)
    results = [bench_shape(s.strip(), a) for s in a.shapes.split(",") if s.strip()]
    meta = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "loadavg": os.getloadavg(), "nproc": os.cpu_count()}
    (a.out / "results.json").write_text(json.dumps({"meta": meta, "results": results}, indent=2, default=str))
    table = render(results)
    (a.out / "results.md").write_text(table + "\n")
    print(table)


if __name__ == "__main__":
    main()
