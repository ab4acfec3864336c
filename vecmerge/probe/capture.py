"""The inputs of targeted modules, gathered by forward hooks while the model reads prompt files.

For every prompt set and every targeted module, with ``X`` the module's input rows at every position of
``prompt + target`` of every item (padding positions left out), ``G = X^T X`` (float64) as an ``Inputs``
(``probe/inputs.py``): the rows themselves while they are fewer than the width (a copy during the forward; U from
their float64 SVD afterwards, exact), an exact float64 Gram beyond, and for inputs wider than ``EXACT_WIDTH`` a
Frequent Directions sketch with its error bound once the rows exceed ``2 l``. Modules that read the same input
tensor (q/k/v of one layer, gate/up of one MLP) share one ``Inputs``. The model runs with the backbone's update on
(``hooks.LoraHooks``), so the rows are the inputs the step will meet; rows are taken item by item in the order
``(-length, line)``, each item's positions in order (a sketch depends on it).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..analysis.protect import decompose_factor, decompose_gram, energy_cut
from ..errors import ModelError
from . import inputs as _inputs
from .hooks import LoraHooks, Update
from .inputs import Inputs
from .prompts import PromptSet
from .runner import _batch_tensors

KEEP = 4  # decompositions kept by Grams.basis: a layer's distinct inputs (q/k/v, o, gate/up, down)


@dataclass
class Grams:
    """Per set, per module, the input rows as ``Inputs`` (modules of one input share it); rows counted per set.

    Args:
        by_set (dict[str, dict[str, Inputs]]): set name -> module -> its inputs (``.gram()`` is ``X^T X``).
        rows (dict[str, int]): set name -> token positions read. groups (list[tuple[str, ...]]): modules sharing
            an input.
    """

    by_set: dict = field(default_factory=dict)
    rows: dict = field(default_factory=dict)
    groups: list = field(default_factory=list)
    exact_width: int = 0
    sketch_rows: int = 0
    _decomp: dict = field(default_factory=dict, repr=False)

    def total(self, sets, module: str) -> torch.Tensor:
        """``sum_k G_k`` of ``module`` over ``sets`` (float64, formed: ``basis`` avoids it where rows are kept)."""
        out: torch.Tensor | None = None
        for k in sets:
            g = self.by_set[k][module].gram()
            out = g.clone() if out is None else out + g
        if out is None:
            raise ValueError(f"no protected set captured module {module}")  # a caller's error: sets is never empty
        return out

    def basis(self, sets, module: str, energy: float) -> torch.Tensor:
        """``U`` of ``module``: the fewest top eigenvectors of ``sum_k G_k`` over ``sets`` holding ``energy`` of its
        trace (``analysis.protect.energy_basis``), from the stacked rows' float64 SVD where every set kept rows or a
        sketch, else from the summed Gram's eigh; the last ``KEEP`` decompositions are kept (q/k/v, gate/up share one).

        Args:
            sets (Iterable[str]): protected set names. module (str). energy (float): E in (0, 1].
        """
        sets = tuple(sets)
        key = tuple(id(self.by_set[k][module]) for k in sets)  # modules that share their inputs share this
        if key not in self._decomp:
            factors = [self.by_set[k][module].factor() for k in sets]
            if factors and all(f is not None for f in factors):
                self._decomp[key] = decompose_factor(torch.cat(factors))
            else:
                self._decomp[key] = decompose_gram(self.total(sets, module))
            while len(self._decomp) > KEEP:  # a whole model's eigenvectors would weigh as much as its Grams again
                self._decomp.pop(next(iter(self._decomp)))
        w, V = self._decomp[key]
        return energy_cut(w, V, energy)[0]

    def sketched(self) -> dict:
        """``{module: [Inputs.describe() per set]}`` for the modules whose inputs were sketched in some set."""
        out: dict = {}
        for k, mods in self.by_set.items():
            for m, inp in mods.items():
                if inp.kind == "sketch":
                    out.setdefault(m, {})[k] = inp.describe()
        return out

    def nbytes(self) -> int:
        """The memory the captured inputs hold (each shared ``Inputs`` once)."""
        unique = {id(i): i for mods in self.by_set.values() for i in mods.values()}
        return sum(i.nbytes() for i in unique.values())


class _Recorder:
    """Forward hooks that keep each targeted module's input rows of the current forward pass (a copy per input)."""

    def __init__(self, model, modules):
        self.mask = None
        self.acc: dict = {}
        self._last = None  # (input tensor, group key list): the previous module's input, to share its rows
        self._handles = [model.get_submodule(m).register_forward_hook(self._hook(m)) for m in sorted(set(modules))]

    def _hook(self, name: str):
        def record(module, args, output):
            x = args[0]
            if self._last is not None and self._last[0] is x:
                self._last[1].append(name)
                return None
            group = [name]
            self._last = (x, group)
            self.acc[id(group)] = [group, x[self.mask].float()]
            return None

        return record

    def take(self) -> list:
        """``[(modules, rows)]`` of the last forward pass, and forget it."""
        out = [(tuple(g), X) for g, X in self.acc.values()]
        self.acc, self._last = {}, None
        return out

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []


def capture_grams(model, backbone: dict[str, Update], sets: dict[str, PromptSet], modules, *, batch: int = 8,
                  device="cpu", progress=None, sketch_rows: int | None = None,
                  exact_width: int | None = None, row_limit: int | None = None) -> Grams:
    """Run ``model`` with ``backbone`` on every set, teacher-forced; each module input's rows per set (``Inputs``).

    Args:
        model (torch.nn.Module): the loaded base (``runner.load_base``). backbone (dict[str, Update]): the step's
            base update per module (hooks). sets (dict[str, PromptSet]): name -> items. modules (Iterable[str]):
            the targeted modules. batch (int): items per forward pass. device: where the batches go.
        progress: optional iterable wrapper. sketch_rows, exact_width, row_limit: ``Inputs``' (default
            ``inputs.SKETCH_ROWS``, ``inputs.EXACT_WIDTH``; ``row_limit=0`` forms a float64 Gram from the first batch,
            the earlier way, for benchmarks).
    """
    modules = sorted(set(modules))
    sketch_rows = _inputs.SKETCH_ROWS if sketch_rows is None else sketch_rows
    exact_width = _inputs.EXACT_WIDTH if exact_width is None else exact_width
    out = Grams(exact_width=exact_width, sketch_rows=sketch_rows)
    device = torch.device(device)
    rec = _Recorder(model, modules)
    try:
        with LoraHooks(model, backbone) as hooks:
            hooks.use(backbone)
            for name, ps in sets.items():
                held: dict[tuple, Inputs] = {}
                items = sorted(ps.items, key=lambda it: (-it.length, it.line))
                chunks = [items[i:i + batch] for i in range(0, len(items), batch)]
                for chunk in (progress(chunks) if progress else chunks):
                    ids, att, _, _, _ = _batch_tensors(chunk, device)
                    rec.mask = att.bool()
                    with torch.inference_mode():
                        model(input_ids=ids, attention_mask=att, use_cache=False)
                    for group, X in rec.take():
                        if group not in held:
                            held[group] = Inputs(X.shape[-1], sketch_rows=sketch_rows, exact_width=exact_width,
                                                 row_limit=row_limit)
                        held[group].add(X.cpu())
                out.rows[name] = sum(it.length for it in ps.items)
                out.by_set[name] = _per_module(held, modules)
                out.groups = sorted(set(out.groups) | set(held))
    finally:
        rec.remove()
    return out


def _per_module(held: dict, modules: list) -> dict:
    """module -> its ``Inputs``: the one shared by its group (batches always group a module alike)."""
    owners: dict[str, list] = {}
    for group in held:
        for m in group:
            owners.setdefault(m, []).append(group)
    out = {}
    for m in modules:
        gs = owners.get(m, [])
        if len(gs) != 1:
            why = ("the forward pass never reached this module, so its inputs are unknown" if not gs else
                   "the forward passes fed it different inputs from batch to batch")
            raise ModelError(f"{m}: {why}; --exclude it or use a base model that runs it")
        out[m] = held[gs[0]]
    return out
