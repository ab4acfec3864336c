"""The Grams of targeted modules' inputs, accumulated by forward hooks while the model reads prompt files.

For every prompt set and every targeted module, with ``X`` the module's input rows at every position of
``prompt + target`` of every item (padding positions left out)::

    G = sum over batches of X^T X          (in, in), float64

Modules that read the same input tensor (q/k/v of one layer, gate/up of one MLP) share one Gram: memory is the
model plus one ``in x in`` float64 matrix per distinct input and set. The model runs with the backbone's update on
(``hooks.LoraHooks``), so the rows are the inputs the step will meet. Inputs wider than ``WIDE`` are refused here
(a streaming sketch is not implemented).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..errors import ModelError
from .hooks import LoraHooks, Update
from .prompts import PromptSet
from .runner import _batch_tensors

WIDE = 16384  # widest input whose exact Gram is formed (16384^2 float64 = 2 GiB)


@dataclass
class Grams:
    """Per set, per module, ``X^T X`` (modules of one input share the tensor); rows counted per set.

    Args:
        by_set (dict[str, dict[str, Tensor]]): set name -> module -> (in, in) float64.
        rows (dict[str, int]): set name -> token positions read. groups (list[tuple[str, ...]]): modules sharing
            an input.
    """

    by_set: dict = field(default_factory=dict)
    rows: dict = field(default_factory=dict)
    groups: list = field(default_factory=list)

    def total(self, sets, module: str) -> torch.Tensor:
        """``sum_k G_k`` of ``module`` over ``sets`` (float64)."""
        out: torch.Tensor | None = None
        for k in sets:
            g = self.by_set[k][module]
            out = g.clone() if out is None else out + g
        if out is None:
            raise ValueError(f"no protected set captured module {module}")  # a caller's error: sets is never empty
        return out


class _Recorder:
    """Forward hooks that add ``X^T X`` of each targeted module's input rows to the current set's Grams."""

    def __init__(self, model, modules):
        self.mask = None
        self.acc: dict = {}
        self._last = None  # (input tensor, group key list): the previous module's input, to share its Gram
        self.seen: dict = {}  # module -> tuple of modules that read its input (first batch)
        self._handles = [model.get_submodule(m).register_forward_hook(self._hook(m)) for m in sorted(set(modules))]

    def _hook(self, name: str):
        def record(module, args, output):
            x = args[0]
            if self._last is not None and self._last[0] is x:
                self._last[1].append(name)
                return None
            rows = x[self.mask].to(torch.float64)
            group = [name]
            self._last = (x, group)
            self.acc.setdefault(id(group), [group, None])
            self.acc[id(group)][1] = rows.T @ rows
            return None

        return record

    def take(self) -> list:
        """``[(modules, Gram)]`` of the last forward pass, and forget it."""
        out = [(tuple(g), G) for g, G in self.acc.values()]
        self.acc, self._last = {}, None
        return out

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []


def capture_grams(model, backbone: dict[str, Update], sets: dict[str, PromptSet], modules, *, batch: int = 8,
                  device="cpu", progress=None) -> Grams:
    """Run ``model`` with ``backbone`` on every set, teacher-forced; the Grams of ``modules``' inputs per set.

    Args:
        model (torch.nn.Module): the loaded base (``runner.load_base``). backbone (dict[str, Update]): the step's
            base update per module (hooks). sets (dict[str, PromptSet]): name -> items. modules (Iterable[str]):
            the targeted modules. batch (int): items per forward pass. device: where the batches go.
        progress: optional iterable wrapper.
    """
    modules = sorted(set(modules))
    for m in modules:
        w = getattr(model.get_submodule(m), "in_features", None)
        if w is not None and w > WIDE:
            raise ModelError(f"{m}: input width {w} is over {WIDE}; protection forms an exact {w} x {w} Gram, and a "
                             "streaming sketch for such widths is not implemented; --exclude this module")
    out = Grams()
    device = torch.device(device)
    rec = _Recorder(model, modules)
    try:
        with LoraHooks(model, backbone) as hooks:
            hooks.use(backbone)
            for name, ps in sets.items():
                grams: dict[tuple, torch.Tensor] = {}
                items = sorted(ps.items, key=lambda it: (-it.length, it.line))
                chunks = [items[i:i + batch] for i in range(0, len(items), batch)]
                for chunk in (progress(chunks) if progress else chunks):
                    ids, att, _, _, _ = _batch_tensors(chunk, device)
                    rec.mask = att.bool()
                    with torch.inference_mode():
                        model(input_ids=ids, attention_mask=att, use_cache=False)
                    for group, G in rec.take():
                        grams[group] = G if group not in grams else grams[group] + G
                out.rows[name] = sum(it.length for it in ps.items)
                out.by_set[name] = _per_module(grams, modules)
                out.groups = sorted(set(out.groups) | set(grams))
    finally:
        rec.remove()
    return out


def _per_module(grams: dict, modules: list) -> dict:
    """module -> its Gram: the shared tensor of the one group that holds it (a sum if batches grouped it apart)."""
    owners: dict[str, list] = {}
    for group in grams:
        for m in group:
            owners.setdefault(m, []).append(group)
    out = {}
    for m in modules:
        gs = owners.get(m, [])
        if not gs:
            raise ModelError(f"{m}: the forward pass never reached this module, so its inputs are unknown; "
                             "--exclude it or use a base model that runs it")
        out[m] = grams[gs[0]] if len(gs) == 1 else sum(grams[g] for g in gs)
    return out
