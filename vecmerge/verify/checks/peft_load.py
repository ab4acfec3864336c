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
  share of the adapter's own effect (see ``outputs.manifest.TOLERANCES``);
- merge round trip: ``merge_and_unload`` leaves ``W_m + D_m``: ``||merged - (W + D)|| / ||W + D||
  <= MERGE_RTOL`` (1e-6: float32 rounding of the sum, u = 6e-8).

A ``lora_bias`` output's layers also add ``b_m = scale * lora_B.bias`` (``Adapter.bias``) to their outputs: the
hand patch adds it to the base layer's bias (one made for the patch where the base layer has none), the merge
round trip checks the merged bias is ``bias + b_m`` (PEFT cannot merge it into a layer without a bias: then the
merge check is not run, and says so). ``update.bias_check`` compares ``b_m`` with the recomputed bias.

The model is loaded in float32 whatever its stored dtype. peft and transformers are imported here only.
A parameter adapted through ``target_parameters`` is one PEFT layer (a ``ParamWrapper``) holding all its
experts: its ``get_delta_weight`` is (E, out, in), or (E, in, out) where the experts are stored transposed,
and is compared with ours expert by expert; the hand patch and the merge act on the 3-D parameter.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ...errors import few
from ...peft.adapter import Adapter
from ...peft.format import PREFIX
from ...peft.params import entry_name, unwrap
from ..report import check, not_run, within

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
    m = max(errs, key=lambda k: errs[k], default=None)
    worst = errs[m] if m is not None else 0.0
    bad = [k for k, v in errs.items() if not within(v, tol)]
    return check(name, not bad, (f"{len(bad)}/{len(errs)} modules: {what} off by up to {worst:.3e} > {tol:g} "
                                 f"({few(bad)})" if bad else f"{what}: largest difference {worst:.3e} <= {tol:g}"),
                 {"max_rel_error": worst, "worst_module": m, "tolerance": tol})


@dataclass(frozen=True)
class Target:
    """One PEFT LoRA layer and the modules of ours it holds (one, or one per expert of a 3-D parameter).

    Args:
        path (str): its module path (``base_layer`` included for a nested ParamWrapper). layer: the LoraLayer.
        entries (tuple[str]): our module names, in expert order. param (str | None): the wrapped parameter.
    """

    path: str
    layer: Any
    entries: tuple
    param: str | None

    def weight(self):
        """The base parameter PEFT adds the delta to (a 3-D one for experts)."""
        return self.layer.get_param() if self.param else self.layer.get_base_layer().weight

    def merged(self, model):
        """The same parameter in ``model`` after ``merge_and_unload``."""
        holder = unwrap(self.path)[0]
        return getattr(model.get_submodule(holder), self.param or "weight")

    def layout(self, per_entry: dict, specs: dict) -> torch.Tensor:
        """Our (out, in) updates of its entries in the base parameter's layout: (E, out, in) or (E, in, out)."""
        if len(self.entries) > 1:
            d = torch.stack([per_entry[m] for m in self.entries])
            return d if self.layer._did_swap_in_out_features else d.transpose(1, 2)
        m = self.entries[0]
        return per_entry[m].T if specs[m].transposed else per_entry[m]

    def split(self, x: torch.Tensor) -> dict:
        """``{entry: its slice}`` of a tensor in this layout."""
        return dict(zip(self.entries, x)) if len(self.entries) > 1 else {self.entries[0]: x}


def _lora_layers(model) -> dict:
    """``{path: Target}`` of every PEFT LoRA layer holding adapter ``default``."""
    from peft.tuners.lora import LoraLayer

    out = {}
    for name, mod in model.named_modules():
        if not (isinstance(mod, LoraLayer) and ("default" in mod.lora_A or "default" in mod.lora_embedding_A)):
            continue
        path, param = name.removeprefix(PREFIX), getattr(mod, "parameter_name", None)
        entries: tuple[str, ...]
        if param is None:
            entries = (path,)
        else:
            holder, experts = unwrap(path)[0], getattr(mod, "num_experts", 1)
            entries = tuple(entry_name(holder, param, e) for e in range(experts)) if experts > 1 \
                else (entry_name(holder, param),)
        out[path] = Target(path, mod, entries, param)
    return out


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
    if head is None or any(t.param is None and t.layer.get_base_layer() is head for t in layers.values()):
        return None
    tied = any(t.weight() is head.weight for t in layers.values())
    return head if tied else None


def _patched_logits(peft_model, layers: dict, W: dict, deltas: dict, ids, biases: dict | None = None) -> torch.Tensor:
    """Logits of the base with ``W_t + delta_t`` written into each base parameter (adapter disabled).

    Args:
        layers (dict[str, Target]). W, deltas (dict[str, Tensor]): per target, in the parameter's layout.
        biases (dict[str, Tensor] | None): per ``lora_bias`` target, its bias update, added to the layer's bias.
    """
    head = _untied_head(peft_model, layers)
    shared = head.weight if head is not None else None
    saved = {}
    try:
        for t, b in (biases or {}).items():
            base = layers[t].layer.get_base_layer()
            saved[t] = bias = base.bias
            old = bias.detach().double() if bias is not None else torch.zeros_like(b)
            base.bias = torch.nn.Parameter((old + b).to(W[t].dtype), requires_grad=False)
        if head is not None and shared is not None:
            head.weight = torch.nn.Parameter(shared.detach().clone(), requires_grad=False)
        for t, target in layers.items():
            w = target.weight()
            w.data.copy_((W[t].double() + deltas[t]).to(w.dtype))
        with peft_model.disable_adapter():
            return _logits(peft_model, ids)
    finally:
        for t, target in layers.items():
            target.weight().data.copy_(W[t])
        for t, b in saved.items():
            layers[t].layer.get_base_layer().bias = b
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
        tol (dict): ``outputs.manifest.TOLERANCES[dtype]``. progress: optional iterable wrapper.
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
    held = {m: t for t, target in layers.items() for m in target.entries}
    missing, extra = sorted(set(out.modules) - set(held)), sorted(set(held) - set(out.modules))
    scale_off = [m for m in set(held) & set(out.modules)
                 if abs(layers[held[m]].layer.scaling["default"] - out.specs[m].scale)
                 > SCALE_RTOL * abs(out.specs[m].scale)]
    why = ([f"not wrapped by PEFT: {few(missing)}"] if missing else []) + (
        [f"wrapped but not written: {few(extra)}"] if extra else []) + (
        [f"PEFT scale differs from ours in {few(scale_off)}"] if scale_off else [])
    checks.append(check("peft modules", not why, "; ".join(why) or
                        f"PEFT wraps exactly the {len(held)} written modules, with our scales",
                        {"wrapped": len(held), "written": len(out.modules)}))
    common = [t for t, target in layers.items() if all(m in out.specs for m in target.entries)]
    W: dict = {}
    ours: dict = {}
    errs: dict = {}
    for t in progress(common) if progress else common:
        target = layers[t]
        W[t] = target.weight().detach().clone()
        ours[t] = target.layout({m: out.factors(m).dense() for m in target.entries}, out.specs)
        with torch.no_grad():
            theirs = target.split(target.layer.get_delta_weight("default"))
        errs.update((m, _rel(theirs[m], d)) for m, d in target.split(ours[t]).items())
    checks.append(_worst(errs, PEFT_DELTA_RTOL, "peft delta", "PEFT get_delta_weight against ours"))
    if not common:
        return checks + [check("logits", False, "no module of the output is a layer of the base model: nothing "
                               "was compared; give the base model the adapter was trained on")]
    emb = model.get_input_embeddings()
    vocab = emb.get_base_layer().num_embeddings if hasattr(emb, "get_base_layer") else emb.num_embeddings
    ids = torch.randint(0, vocab, PROMPT_SHAPE, generator=torch.Generator().manual_seed(PROMPT_SEED))
    got = _logits(model, ids)
    with model.disable_adapter():
        plain = _logits(model, ids)
    patched = {t: layers[t] for t in common}
    biases = {t: out.bias(layers[t].entries[0]) for t in common if layers[t].entries[0] in out.bias_keys}
    ref = _patched_logits(model, patched, W, ours, ids, biases)
    top = max(float(ref.abs().max()), 1e-30)
    diff, effect = float((got - ref).abs().max()) / top, float((got - plain).abs().max()) / top
    checks.append(check("logits", within(diff, LOGITS_RTOL),
                        f"PEFT's logits against W + our delta patched by hand: max|dl|/max|l| = {diff:.3e} "
                        f"(<= {LOGITS_RTOL:g}; the adapter itself moves them {effect:.3e}), prompt "
                        f"{PROMPT_SHAPE} seed {PROMPT_SEED}",
                        {"rel_max_diff": diff, "tolerance": LOGITS_RTOL, "adapter_effect": effect, "max_logit": top}))
    if expected is not None:
        dense = {t: layers[t].layout({m: expected[m].dense() for m in layers[t].entries}, out.specs) for t in common}
        ref_e = _patched_logits(model, patched, W, dense, ids, biases)  # the bias: update.bias_check
        de = float((got - ref_e).abs().max()) / top
        lt = LOGITS_RTOL + tol["logits"] * effect
        checks.append(check("logits vs intended", within(de, lt),
                            f"PEFT's logits against W + the recomputed update: max|dl|/max|l| = {de:.3e} (<= "
                            f"{LOGITS_RTOL:g} + {tol['logits']:g} x the adapter's effect {effect:.3e})",
                            {"rel_max_diff": de, "tolerance": lt, "adapter_effect": effect}))
    no_bias = [t for t in biases if layers[t].layer.get_base_layer().bias is None]
    if no_bias:
        return checks + [not_run("merge_and_unload", f"PEFT cannot merge lora_bias into a layer without a bias "
                                 f"({few(no_bias)}); the logits checks cover the bias")]
    B0 = {t: layers[t].layer.get_base_layer().bias.detach().double() + b for t, b in biases.items()}
    merged = model.merge_and_unload()
    merr: dict = {}
    for t in common:
        want = layers[t].split(W[t].double() + ours[t])
        got_w = layers[t].split(layers[t].merged(merged).detach())
        merr.update((m, _rel(got_w[m], want[m])) for m in layers[t].entries)
        if t in B0:
            holder = merged.get_submodule(unwrap(t)[0])
            merr[f"{t} (bias)"] = _rel(holder.bias.detach(), B0[t])
    checks.append(_worst(merr, MERGE_RTOL, "merge_and_unload", "merged weights against W + our delta"))
    return checks
