"""What one adapter module is, without its tensors: kind, shape, rank, scale, layout, place among MoE experts."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModuleSpec:
    """What a module is, without its tensors.

    Args:
        name (str): module path in the model, e.g. ``model.layers.0.self_attn.q_proj``; for an expert
            ``<module>.<parameter>.<e>``, e.g. ``model.layers.0.mlp.experts.gate_up_proj.3``.
        kind (str): ``linear``, ``embedding`` or ``expert`` (how it is stored).
        shape (tuple[int, int]): (out, in) of ``B @ A``. rank (int): stored r (per expert). scale (float).
        transposed (bool): the base weight holds ``(B @ A).T``.
        dtype (str): fp32, fp16 or bf16. keys (tuple[str, str]): the file keys of A and B (an expert's
            are its parameter's, shared by all its experts).
        param (str | None): the ``nn.Parameter`` adapted through ``target_parameters`` (None: a module
            adapted through ``target_modules``). holder (str | None): the module holding it.
        expert (int | None): the expert index in a 3-D parameter. experts (int): E of that parameter.
    """

    name: str
    kind: str
    shape: tuple
    rank: int
    scale: float
    transposed: bool
    dtype: str
    keys: tuple
    param: str | None = None
    expert: int | None = None
    experts: int = 1
    holder: str | None = None

    @property
    def weight_shape(self) -> tuple[int, int]:
        return (self.shape[1], self.shape[0]) if self.transposed else self.shape

    @property
    def target(self) -> str:
        """The name PEFT resolves r and alpha on: ``<module>.<parameter>`` for a wrapped parameter."""
        return f"{self.holder}.{self.param}" if self.param else self.name
