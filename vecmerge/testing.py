"""Test helpers for users and for vecmerge's own suite: real PEFT folders from random factors.

``toy_adapter`` writes a folder ``PeftModel.from_pretrained`` loads (keys, config and dtype as PEFT
saves them); ``toy_trajectory`` writes correlated checkpoints named like the user's (v28, v51,
v54e2, v54) with a known shared direction; ``assert_delta_close`` compares updates in factored form.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch

from .errors import few
from .linalg.lowrank import LowRank, relative_error
from .peft.format import CONFIG_NAME, DTYPES, SAFETENSORS_NAME, factor_keys, peft_scale
from .verify.checks.output import verify_output
from .workspace.taskvector import TaskVector

QWEN3_TYPES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def llm_shapes(layers: int, hidden: int, intermediate: int, heads: int, kv_heads: int,
               head_dim: int | None = None) -> dict[str, tuple[int, int]]:
    """(out, in) of q/k/v/o/gate/up/down in every layer of a Llama/Qwen-style decoder.

    Args:
        layers (int): decoder layers. hidden (int): model width. intermediate (int): MLP width.
        heads (int), kv_heads (int): attention heads. head_dim (int | None): default hidden // heads.
    """
    d = head_dim or hidden // heads
    per = {"self_attn.q_proj": (heads * d, hidden), "self_attn.k_proj": (kv_heads * d, hidden),
           "self_attn.v_proj": (kv_heads * d, hidden), "self_attn.o_proj": (hidden, heads * d),
           "mlp.gate_proj": (intermediate, hidden), "mlp.up_proj": (intermediate, hidden),
           "mlp.down_proj": (hidden, intermediate)}
    return {f"model.layers.{i}.{k}": v for i in range(layers) for k, v in per.items()}


def shapes_from_config(config) -> dict[str, tuple[int, int]]:
    """``llm_shapes`` for a ``transformers`` config object or dict (Qwen3, Llama, Mistral...)."""
    get = (lambda k, d=None: config.get(k, d)) if isinstance(config, dict) else (
        lambda k, d=None: getattr(config, k, d))
    return llm_shapes(get("num_hidden_layers"), get("hidden_size"), get("intermediate_size"),
                      get("num_attention_heads"), get("num_key_value_heads") or get("num_attention_heads"),
                      get("head_dim"))


def random_factors(shapes: dict, rank: int, seed: int, std: float = 0.02) -> dict[str, tuple]:
    """``{module: (B (out, r), A (r, in))}`` with N(0, std^2) entries, float32, seeded."""
    g = torch.Generator().manual_seed(seed)
    return {m: (torch.randn(o, rank, generator=g) * std, torch.randn(rank, i, generator=g) * std)
            for m, (o, i) in shapes.items()}


def write_peft_folder(out, factors: dict, *, r: int, lora_alpha: float, rslora: bool = False,
                      dtype: str = "fp32", rank_pattern=None, alpha_pattern=None,
                      base_model: str = "toy-base", extra_config: dict | None = None,
                      embedding: tuple = ()) -> Path:
    """Write ``{module: (B, A)}`` as a PEFT LoRA folder, keys and config as PEFT saves them.

    Args:
        out (str | Path): folder to create. factors (dict): module -> (B (out, r), A (r, in)).
        r (int), lora_alpha (float), rslora (bool), rank_pattern, alpha_pattern: the config.
        dtype (str): fp32, bf16 or fp16 storage. embedding (tuple[str]): modules stored as
            ``lora_embedding_A/B`` (then B@A is (dim, vocab)).
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    from safetensors.torch import save_file

    tensors = {}
    for m, (B, A) in factors.items():
        ka, kb = factor_keys(m, "embedding" if m in embedding else "linear")
        tensors[ka] = A.to(DTYPES[dtype]).contiguous()
        tensors[kb] = B.to(DTYPES[dtype]).contiguous()
    save_file(tensors, str(out / SAFETENSORS_NAME), metadata={"format": "pt"})
    types = sorted({m.rsplit(".", 1)[-1] for m in factors})
    config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base_model,
              "r": r, "lora_alpha": lora_alpha, "use_rslora": rslora, "target_modules": types,
              "rank_pattern": rank_pattern or {}, "alpha_pattern": alpha_pattern or {},
              "lora_dropout": 0.0, "bias": "none", "fan_in_fan_out": False, "use_dora": False,
              "init_lora_weights": True, "inference_mode": True, "modules_to_save": None}
    config.update(extra_config or {})
    (out / CONFIG_NAME).write_text(json.dumps(config, indent=2))
    return out


def toy_adapter(out, *, shapes: dict | None = None, config=None, rank: int = 4, seed: int = 0,
                rslora: bool = False, lora_alpha: float | None = None, dtype: str = "fp32",
                std: float = 0.02, **kwargs) -> Path:
    """A real PEFT LoRA folder with random factors, for given shapes or a ``transformers`` config.

    Args:
        out (str | Path): folder to create.
        shapes (dict | None): module -> (out, in); default: a 2-layer toy Qwen3 (hidden 32).
        config: a ``transformers`` config (or dict) whose q/k/v/o/gate/up/down shapes to use.
        rank (int): LoRA r. seed (int): factor seed. rslora (bool): scale rule.
        lora_alpha (float | None): default ``2 * rank``. dtype (str): fp32, bf16, fp16.
        **kwargs: passed to ``write_peft_folder`` (rank_pattern, alpha_pattern, base_model...).
    """
    if shapes is None:
        shapes = shapes_from_config(config) if config is not None else llm_shapes(2, 32, 48, 4, 2, 8)
    return write_peft_folder(out, random_factors(shapes, rank, seed, std), r=rank,
                             lora_alpha=float(lora_alpha if lora_alpha is not None else 2 * rank),
                             rslora=rslora, dtype=dtype, **kwargs)


def toy_trajectory(root, *, shapes: dict | None = None, rank: int = 4, seed: int = 0, step: float = 0.3,
                   disagree: tuple = (), unrelated: bool = False, dtype: str = "fp32",
                   factor_noise: float = 0.0) -> dict[str, Path]:
    """Correlated checkpoints v28, v51 (continuation of v28), v54e2, v54 (next epoch), plus vecmerge.yaml.

    Every adapter has rank ``2 * rank``: an own random part and a part along a shared per-module
    direction ``D_m = Bd_m Ad_m``. v51 - v28 and v54 - v54e2 both move along D_m (plus small own
    noise), so their signs agree in every module except those in ``disagree``, where the backbone's
    step points the other way. With ``unrelated=True`` the two steps use independent directions.
    ``factor_noise`` (a share, e.g. 0.02) also moves the other factors of v51, v54e2 and v54 (the shared
    direction's and the A factors) by independent noise, as training does: without it checkpoints repeat
    each other's factors exactly, so their stacked factors are rank-deficient (trained adapters never are).

    Returns:
        {"v28": Path, "v51": Path, "v54e2": Path, "v54": Path}
    """
    root = Path(root)
    shapes = shapes or llm_shapes(2, 32, 48, 4, 2, 8)
    g = torch.Generator().manual_seed(seed)

    def rnd(*s):
        return torch.randn(*s, generator=g) * 0.05

    shared = {m: (rnd(o, rank), rnd(rank, i)) for m, (o, i) in shapes.items()}
    other = {m: (rnd(o, rank), rnd(rank, i)) for m, (o, i) in shapes.items()} if unrelated else shared
    own28 = {m: (rnd(o, rank), rnd(rank, i)) for m, (o, i) in shapes.items()}
    own54 = {m: (rnd(o, rank), rnd(rank, i)) for m, (o, i) in shapes.items()}
    paths = {}

    def save(name, own, dirs, coef, jitter, move=0.0):
        fac = {}
        for m in shapes:
            Bo, Ao = own[m]
            Bd, Ad = dirs[m]
            c = coef(m)
            if move:
                Ao, Bd, Ad = (x + move * rnd(*x.shape) for x in (Ao, Bd, Ad))
            fac[m] = (torch.cat([Bo + jitter * rnd(*Bo.shape), c * Bd], 1), torch.cat([Ao, Ad], 0))
        paths[name] = write_peft_folder(root / name, fac, r=2 * rank, lora_alpha=2 * rank, dtype=dtype)

    save("v28", own28, shared, lambda m: 1.0, 0.0)
    save("v51", own28, shared, lambda m: 1.0 + step, 0.02, factor_noise)
    save("v54e2", own54, other, lambda m: 0.5, 0.0, factor_noise)
    save("v54", own54, other, lambda m: 0.5 + (-step if m in disagree else step), 0.02, factor_noise)
    (root / "vecmerge.yaml").write_text("adapters:\n" + "".join(f"  {k}: {k}\n" for k in paths))
    return paths


def assert_delta_close(actual, expected, rtol: float = 1e-6, atol: float = 0.0) -> None:
    """Assert ``||actual - expected||_F <= atol + rtol * ||expected||_F``, per module, factored.

    Args:
        actual, expected: LowRank, TaskVector, dense tensors, or dicts of those, keyed alike.
        rtol (float), atol (float): the tolerance, in Frobenius norm.
    """
    def by_module(x):
        if isinstance(x, TaskVector):
            return x.modules
        return x if isinstance(x, dict) else {"": x}

    a, e = by_module(actual), by_module(expected)
    if set(a) != set(e):
        raise AssertionError(f"module sets differ: only actual [{few(sorted(set(a) - set(e)), 5)}], "
                             f"only expected [{few(sorted(set(e) - set(a)), 5)}]")
    for m in e:
        x, y = a[m], e[m]
        if isinstance(x, LowRank) and isinstance(y, LowRank):
            err, ref = (x - y).norm(), y.norm()
        else:
            xd = x.dense() if isinstance(x, LowRank) else x.double()
            yd = y.dense() if isinstance(y, LowRank) else y.double()
            err, ref = float(torch.linalg.norm(xd - yd)), float(torch.linalg.norm(yd))
        if err > atol + rtol * ref:
            raise AssertionError(f"module {m or '(single)'}: ||actual - expected|| = {err:.3e} > "
                                 f"atol {atol:g} + rtol {rtol:g} * ||expected|| ({ref:.3e}); "
                                 f"relative {err / ref if ref else err:.3e}")


def tree_hashes(folder) -> dict:
    """``{relative path: sha256}`` of every file under ``folder``: compare before and after to prove
    that inputs were not touched."""
    folder = Path(folder)
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


__all__ = ["tree_hashes", "llm_shapes", "shapes_from_config", "random_factors", "write_peft_folder", "toy_adapter",
           "toy_trajectory", "assert_delta_close", "peft_scale", "relative_error"]


def assert_merge_identity(out, base_model=None) -> None:
    """Assert that ``vecmerge verify OUT`` passes: the output re-derives from its manifest.

    Runs ``verify.verify_output``: inputs hash as pinned, the recipe recomputes the recorded alpha,
    every module's ``scale * B @ A`` equals the recomputed ``base + k * alpha * dir'`` within the
    output dtype's tolerance (``outputs.manifest.TOLERANCES``), the config resolves as intended, the sha256s
    match; with ``base_model`` also PEFT's own deltas, logits and ``merge_and_unload``.

    Args:
        out (str | Path): an output folder written by vecmerge (holding ``vecmerge.json``).
        base_model (str | Path | None): a local ``transformers`` model folder for the real-client checks.

    Raises:
        AssertionError listing every failed check with its detail.
    """
    res = verify_output(out, base_model=base_model)
    if not res["passed"]:
        failed = [f"{c['name']}: {c['detail']}" for c in res["checks"] if not c["passed"]]
        raise AssertionError(f"{out}: {len(failed)} verify check(s) failed:\n  " + "\n  ".join(failed))


__all__ += ["assert_merge_identity"]
