"""The one way named inputs are opened and aligned (``project``, ``merge``, ``refactor``, ``run``, ``audit``).

``open_inputs(ws, names)`` opens every named adapter once (a workspace name or a folder), refuses adapters
whose declared base models differ (``base_model.same_base_model``, relative paths read from the workspace
too) unless allowed, lets the caller act on the opened adapters before any tensor is read (the pipeline
reads each file once into memory, hashed, and checks the recipe's pins), then reads each input's task
vector. ``Inputs.align`` checks that the inputs, or expressions over them, can be combined
(``taskvector.align``: equal shapes and layouts, shared modules, nothing missing unless allowed) and
returns the union of their modules; ``Inputs.missing`` says which modules each input lacks (read as zero).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..expr import LinearForm
from .base_model import differ, same_base_model
from .names import Workspace
from .taskvector import TaskVector, align, linear_combination


@dataclass(frozen=True)
class Inputs:
    """Named adapters, opened once, of one declared base model (unless allowed otherwise).

    Args:
        adapters (dict[str, Adapter]): name -> the opened adapter, in first-use order.
        declared (dict[str, str | None]): name -> the base model its config declares.
        vectors (dict[str, TaskVector]): name -> its task vector (its factors as read).
        roots (tuple[Path, ...]): where relative declared base models start (the workspace folder).
    """

    adapters: dict
    declared: dict
    vectors: dict
    roots: tuple = ()

    @property
    def base_models_differ(self) -> bool:
        """Whether the inputs declare more than one base model (possible only when that was allowed)."""
        return differ(self.declared, self.roots)

    def align(self, exprs: Sequence[tuple[str, LinearForm]] | None = None,
              allow_missing: bool = False) -> tuple[list[TaskVector], list[str]]:
        """``(task vectors, modules)``: the inputs themselves (``exprs`` None) or ``sum_i c_i input_i`` of each
        expression, checked to combine (``taskvector.align``, errors naming the labels), and the union of
        their modules in order.

        Args:
            exprs (Sequence[tuple[str, LinearForm]] | None): (label, expression over the inputs' names) pairs.
            allow_missing (bool): a module some input lacks counts as zero (else AlignmentError names it).
        """
        if exprs is None:
            labels, vecs = list(self.vectors), list(self.vectors.values())
        else:
            labels = [label for label, _ in exprs]
            vecs = [linear_combination([(form.coeffs[n], self.vectors[n]) for n in form.names()],
                                       labels=form.names(), allow_missing=allow_missing) for _, form in exprs]
        return vecs, align(vecs, labels, allow_missing)

    def missing(self, modules: list[str]) -> dict[str, list[str]]:
        """Input name -> the modules of ``modules`` it lacks (every input listed, an empty list when none)."""
        return {n: [m for m in modules if m not in v.modules] for n, v in self.vectors.items()}


def open_inputs(ws: Workspace, names, *, modules_to_save: str = "refuse", allow_base_mismatch: bool = False,
                before_reading: Callable[[dict], None] | None = None) -> Inputs:
    """Open the named adapters once, check their declared base models, read their task vectors.

    Args:
        ws (Workspace): resolves the names (and gives the workspace folder and device).
        names (Iterable[str]): adapter names or folders, in first-use order (repeats are opened once).
        modules_to_save (str): ``refuse`` or ``drop`` adapters' full saved modules (``Adapter``).
        allow_base_mismatch (bool): combine adapters that declare different base models.
        before_reading (Callable[[dict[str, Adapter]], None] | None): called with the opened adapters before
            any tensor is read (e.g. to read each file once, hashed, and check pins).

    Returns:
        Inputs; AlignmentError when the declared base models differ (unless allowed).
    """
    adapters = {n: ws.adapter(n, modules_to_save) for n in dict.fromkeys(names)}
    roots = (ws.home,)
    declared = same_base_model(adapters, allow_base_mismatch, roots)
    if before_reading is not None:
        before_reading(adapters)
    vectors = {n: ws.vector(n, modules_to_save) for n in adapters}
    return Inputs(adapters, declared, vectors, roots)
