"""The real client: load the base model and the output through PEFT and compare with vecmerge's numbers.

With ``W_m`` the base weight, ``D_m`` our update of the written adapter in the base layout
(``Adapter.weight_delta``, float64) and ``E_m`` the recomputed intended update (float64, factored,
formed densely only here):

- peft modules: PEFT wraps exactly the written modules, with our scale (rel 1e-12);
- peft delta: ``||get_delta_weight_m - D_m|| / ||D_m|| <= PEFT_DELTA_RTOL`` (1e-5: PEFT forms
  ``B @ A`` in float32, about 1e-7 of the update);
- logits: on a seeded random prompt, PEFT's logits against the base with ``W_m + D_m`` patched in
  by hand, ``max|dl| / max|l| <= LOGITS_RTOL`` (1e-4: two float32 forwards that sum differently);
  for an exact output also against ``W_m + E_m``, within ``LOGITS_RTOL + TOLERANCES[dtype]["logits"]
  * effect``, where effect is how far the adapter moves the logits (``max|l - l_base| / max|l|``):
  the written factors are E rounded to the output dtype, and that rounding reaches the logits as a
  share of the adapter's own effect (see ``verify.TOLERANCES``);
- merge round trip: ``merge_and_unload`` leaves ``W_m + D_m``: ``||merged - (W + D)|| / ||W + D||
  <= MERGE_RTOL`` (1e-6: float32 rounding of the sum, u = 6e-8).

The model is loaded in float32 whatever its stored dtype. peft and transformers are imported here only.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch

from .adapter import Adapter
from .checks import check, not_run, within
from .errors import few
from .peft_format import PREFIX

PEFT_DELTA_RTOL = 1e-5
LOGITS_RTOL = 1e-4
MERGE_RTOL = 1e-6
SCALE_RTOL = 1e-12
PROMPT_SEED, PROMPT_SHAPE = 0, (2, 16)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """``||a - b||_F / ||b||_F`` (absolute when b is zero), in float64."""
    a, b = a.double(), b.double()
    n = float(torch.linalg.norm(b))
    d = float(torch.linalg.norm(a - b))
    return d / n if n > 0 else d


def _worst(errs: dict, tol: float, name: str, what: str) -> dict:
    m = max(errs, key=errs.get, default=None)
    worst = errs[m] if m is not None else 0.0
    bad = [k for k, v in errs.items() if not within(v, tol)]
    return check(name, not bad, (f"{len(bad)}/{len(errs)} modules: {what} off by up to {worst:.3e} > {tol:g} "
                                 f"({few(bad)})" if bad else f"{what}: largest difference {worst:.3e} <= {tol:g}"),
                 {"max_rel_error": worst, "worst_module": m, "tolerance": tol})


def _lora_layers(model) -> dict:
    from peft.tuners.lora import LoraLayer

    return {name.removeprefix(PREFIX): mod for name, mod in model.named_modules()
            if isinstance(mod, LoraLayer) and ("default" in mod.lora_A or "default" in mod.lora_embedding_A)}


def _logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).logits.double()


def _untied_head(peft_model, layers: dict):
    """The output head when it shares its weight with a patched module (GPT-2's ``wte``/``lm_head``), else None.

    PEFT's embedding LoRA changes the input embedding only; patching a tied weight by hand would move the
    output head too, so the head gets its own copy while the reference logits are computed.
    """
    head = peft_model.get_base_model().get_output_embeddings()
    head = head.get_base_layer() if hasattr(head, "get_base_layer") else head
    if head is None or any(layer.get_base_layer() is head for layer in layers.values()):
        return None
    tied = any(layer.get_base_layer().weight is head.weight for layer in layers.values())
    return head if tied else None


def _patched_logits(peft_model, layers: dict, W: dict, deltas: dict, ids) -> torch.Tensor:
    """Logits of the base with ``W_m + delta_m`` written into each base weight (adapter disabled)."""
    head = _untied_head(peft_model, layers)
    shared = head.weight if head is not None else None
    try:
        if head is not None:
            head.weight = torch.nn.Parameter(shared.detach().clone(), requires_grad=False)
        for m, layer in layers.items():
            w = layer.get_base_layer().weight
            w.data.copy_((W[m].double() + deltas[m]).to(w.dtype))
        with peft_model.disable_adapter():
            return _logits(peft_model, ids)
    finally:
        for m, layer in layers.items():
            layer.get_base_layer().weight.data.copy_(W[m])
        if head is not None:
            head.weight = shared


def _load(base_model: Path, path: Path):
    """``PeftModel.from_pretrained`` of the output on the base (float32, eval), and its warnings."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            base = AutoModelForCausalLM.from_pretrained(str(base_model), dtype=torch.float32)
            model = PeftModel.from_pretrained(base, str(path), is_trainable=False)
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    return model.eval(), caught


def peft_checks(path: Path, out: Adapter, base_model: Path, expected: dict | None, tol: dict,
                progress=None) -> list[dict]:
    """Load ``base_model`` + the output through PEFT; compare deltas, logits and the merged weights.

    Args:
        path (Path): the output folder. out (Adapter): it, opened. base_model (Path): a local
            ``transformers`` model folder. expected (dict[str, LowRank] | None): the recomputed
            intended update per module (None for a rank-cut output or when it could not be recomputed).
        tol (dict): ``verify.TOLERANCES[dtype]``. progress: optional iterable wrapper.
    """
    try:
        model, caught = _load(base_model, path)
    except Exception as e:  # anything PEFT or transformers raises is the finding
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        return [check("peft load", False, f"PeftModel.from_pretrained({base_model}, {path}) failed: "
                      f"{type(e).__name__}: {msg}")]
    notes = sorted({str(w.message).splitlines()[0][:200] for w in caught if "adapter" in str(w.message).lower()})
    checks = [check("peft load", True, f"PeftModel.from_pretrained loads {path.name} on {base_model.name}",
                    {"warnings": notes[:5]})]
    layers = _lora_layers(model)
    missing, extra = sorted(set(out.modules) - set(layers)), sorted(set(layers) - set(out.modules))
    scale_off = [m for m in set(layers) & set(out.modules)
                 if abs(layers[m].scaling["default"] - out.specs[m].scale) > SCALE_RTOL * abs(out.specs[m].scale)]
    why = ([f"not wrapped by PEFT: {few(missing)}"] if missing else []) + (
        [f"wrapped but not written: {few(extra)}"] if extra else []) + (
        [f"PEFT scale differs from ours in {few(scale_off)}"] if scale_off else [])
    checks.append(check("peft modules", not why, "; ".join(why) or
                        f"PEFT wraps exactly the {len(layers)} written modules, with our scales",
                        {"wrapped": len(layers), "written": len(out.modules)}))
    common = [m for m in out.modules if m in layers]
    W, ours, errs = {}, {}, {}
    for m in progress(common) if progress else common:
        W[m] = layers[m].get_base_layer().weight.detach().clone()
        ours[m] = out.weight_delta(m)
        with torch.no_grad():
            errs[m] = _rel(layers[m].get_delta_weight("default"), ours[m])
    checks.append(_worst(errs, PEFT_DELTA_RTOL, "peft delta", "PEFT get_delta_weight against ours"))
    if not common:
        return checks + [not_run("logits", "no module in common")]
    emb = model.get_input_embeddings()
    vocab = emb.get_base_layer().num_embeddings if hasattr(emb, "get_base_layer") else emb.num_embeddings
    ids = torch.randint(0, vocab, PROMPT_SHAPE, generator=torch.Generator().manual_seed(PROMPT_SEED))
    got = _logits(model, ids)
    with model.disable_adapter():
        plain = _logits(model, ids)
    ref = _patched_logits(model, {m: layers[m] for m in common}, W, ours, ids)
    top = max(float(ref.abs().max()), 1e-30)
    diff, effect = float((got - ref).abs().max()) / top, float((got - plain).abs().max()) / top
    checks.append(check("logits", within(diff, LOGITS_RTOL),
                        f"PEFT's logits against W + our delta patched by hand: max|dl|/max|l| = {diff:.3e} "
                        f"(<= {LOGITS_RTOL:g}; the adapter itself moves them {effect:.3e}), prompt "
                        f"{PROMPT_SHAPE} seed {PROMPT_SEED}",
                        {"rel_max_diff": diff, "tolerance": LOGITS_RTOL, "adapter_effect": effect, "max_logit": top}))
    if expected is not None:
        dense = {m: (expected[m].dense().T if out.specs[m].transposed else expected[m].dense()) for m in common}
        ref_e = _patched_logits(model, {m: layers[m] for m in common}, W, dense, ids)
        de = float((got - ref_e).abs().max()) / top
        lt = LOGITS_RTOL + tol["logits"] * effect
        checks.append(check("logits vs intended", within(de, lt),
                            f"PEFT's logits against W + the recomputed update: max|dl|/max|l| = {de:.3e} (<= "
                            f"{LOGITS_RTOL:g} + {tol['logits']:g} x the adapter's effect {effect:.3e})",
                            {"rel_max_diff": de, "tolerance": lt, "adapter_effect": effect}))
    merged = model.merge_and_unload()
    merr = {}
    for m in common:
        want = W[m].double() + ours[m]
        merr[m] = _rel(merged.get_submodule(m).weight.detach(), want)
    checks.append(_worst(merr, MERGE_RTOL, "merge_and_unload", "merged weights against W + our delta"))
    return checks
