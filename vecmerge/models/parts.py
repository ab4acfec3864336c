"""Which tensors of a model are LoRA-able modules, of which kind, and which ones ``--targets`` picks.

By names, no model instantiated: a *module* is a 2-D floating tensor ``<module>.weight``, of kind
``embedding`` (last name in ``EMBEDDING_NAMES``), ``conv1d`` (``model_type`` in ``CONV1D_MODELS`` and last name
in ``CONV1D_NAMES``: weight stored (in, out)) or ``linear``. The LoRA layout is (out, in) = the weight's shape,
transposed for ``conv1d`` and ``embedding``. ``all-linear`` picks every linear and conv1d module but the output
head (``OUTPUT_NAMES``), as PEFT does; other targets match by PEFT's rule (full name or dotted suffix).
``tests/models/test_parts.py`` checks the rules against transformers' Llama, Qwen3 and GPT-2.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import UsageError, few

EMBEDDING_NAMES = ("embed_tokens", "wte", "wpe", "word_embeddings", "embed_in", "embed_positions",
                   "position_embeddings", "token_type_embeddings", "tok_embeddings")
CONV1D_MODELS = ("gpt2", "openai-gpt", "imagegpt", "decision_transformer")
CONV1D_NAMES = ("c_attn", "c_proj", "c_fc", "q_attn")
OUTPUT_NAMES = ("lm_head", "embed_out")
ALL_LINEAR = "all-linear"


@dataclass(frozen=True)
class Part:
    """One LoRA-able module of a model.

    Args:
        name (str): module path (``model.layers.0.self_attn.q_proj``). kind (str): linear | conv1d | embedding.
        weight (str): its weight tensor's name. weight_shape (tuple[int, int]): as stored.
    """

    name: str
    kind: str
    weight: str
    weight_shape: tuple

    @property
    def transposed(self) -> bool:
        """The stored weight is the transpose of the LoRA layout (out, in)."""
        return self.kind in ("conv1d", "embedding")

    @property
    def shape(self) -> tuple[int, int]:
        """(out, in): the shape of ``B @ A``."""
        r, c = self.weight_shape
        return (c, r) if self.transposed else (r, c)

    @property
    def peft_kind(self) -> str:
        """How PEFT stores its factors: ``embedding`` (lora_embedding_A/B) or ``linear`` (lora_A/B)."""
        return "embedding" if self.kind == "embedding" else "linear"


def module_of(tensor: str) -> str:
    """The module a tensor belongs to: its name without the last component (``x.weight`` -> ``x``)."""
    return tensor.rsplit(".", 1)[0] if "." in tensor else tensor


def kind_of(module: str, model_type: str) -> str:
    last = module.rsplit(".", 1)[-1]
    if last in EMBEDDING_NAMES:
        return "embedding"
    if model_type in CONV1D_MODELS and last in CONV1D_NAMES:
        return "conv1d"
    return "linear"


def parts(infos: dict, model_type: str) -> dict[str, Part]:
    """``{module: Part}`` of every 2-D floating ``*.weight`` tensor.

    Args:
        infos (dict[str, TensorInfo]): the model's tensors (``ModelFolder.tensors``). model_type (str): config's.
    """
    out = {}
    for name, t in infos.items():
        if name.endswith(".weight") and len(t.shape) == 2 and t.is_float:
            m = module_of(name)
            out[m] = Part(m, kind_of(m, model_type), name, tuple(t.shape))
    return out


def matches(module: str, target: str) -> bool:
    """PEFT's rule for a target name: the full name, or a suffix after a dot."""
    return module == target or module.endswith("." + target)


def select(available: dict, targets: list[str], flag: str = "--targets") -> list[str]:
    """The modules ``targets`` pick, sorted; a target that picks nothing is an error naming what exists.

    Args:
        available (dict[str, Part]): ``parts(...)`` of the model. targets (list[str]): names, or ``all-linear``.
    """
    if not targets:
        raise UsageError(f"{flag}: no module names given; name modules (q_proj,v_proj) or use {ALL_LINEAR}")
    picked, idle = set(), []
    for t in targets:
        if t == ALL_LINEAR:
            hit = {m for m, p in available.items()
                   if p.kind != "embedding" and m.rsplit(".", 1)[-1] not in OUTPUT_NAMES}
        else:
            hit = {m for m in available if matches(m, t)}
        if not hit:
            idle.append(t)
        picked |= hit
    if idle:
        kinds = sorted({m.rsplit(".", 1)[-1] for m in available})
        raise UsageError(f"{flag}: {few(idle)} match no 2-D weight of the model; it has {few(kinds, 12)} "
                         f"(or use {ALL_LINEAR})")
    return sorted(picked)
