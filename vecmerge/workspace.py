"""Names to folders: a ``vecmerge.yaml`` workspace, and evaluating expressions to task vectors.

``vecmerge.yaml``::

    base_model: base            # optional: a local transformers folder, for verify --base-model
    adapters:
      v54: runs/v54/checkpoint-3
      v51: runs/v51

Paths are relative to the workspace file. A name that is not listed is a folder of that name in
the current directory.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path

from .adapter import Adapter
from .errors import ExpressionError, WorkspaceError, few
from .expr import NAME_RE, LinearForm, parse
from .safe_parse import ParseError, load_yaml, safe_path, short
from .taskvector import TaskVector, linear_combination

WORKSPACE_NAME = "vecmerge.yaml"
WORKSPACE_MAX_BYTES = 1 << 20


class Workspace:
    """Resolves adapter names and keeps each adapter opened once.

    Args:
        path (str | Path | None): a workspace file; None looks for ``vecmerge.yaml`` in ``root``.
        root (str | Path | None): the folder unlisted names resolve in (default: current directory).
        device (str | torch.device | None): where factors are read to (default cpu).
    """

    def __init__(self, path=None, root=None, device=None):
        self.root = Path(root) if root is not None else Path.cwd()
        self.adapters: dict[str, Path] = {}
        self.base_model: Path | None = None
        self.file: Path | None = None
        self.device = device
        if path is None and (self.root / WORKSPACE_NAME).is_file():
            path = self.root / WORKSPACE_NAME
        if path is not None:
            self._load(Path(path))
        self._open: dict[tuple, Adapter] = {}

    def with_inputs(self, inputs: dict) -> Workspace:
        """A copy in which the names of ``inputs`` ({name: path}) resolve to those paths (a recipe's pins)."""
        ws = copy.copy(self)
        ws.adapters = {**self.adapters, **{n: Path(p).resolve() for n, p in inputs.items()}}
        return ws

    def _load(self, path: Path) -> None:
        if not path.is_file():
            raise WorkspaceError(f"{path}: no such workspace file; create it or drop --workspace")
        try:  # bounded, UTF-8, no anchors or aliases (an alias bomb is refused before it expands)
            data = load_yaml(path, max_bytes=WORKSPACE_MAX_BYTES)
            data = {} if data is None else data
            if not isinstance(data, dict):
                raise WorkspaceError(f"{path}: expected a mapping with an 'adapters' key")
            unknown = [short(k, 40) for k in data if k not in ("adapters", "base_model")]
            if unknown:
                raise WorkspaceError(f"{path}: unknown key(s) [{few(unknown)}]; expected 'adapters' and 'base_model'")
            adapters = data.get("adapters") or {}
            if not isinstance(adapters, dict):
                raise WorkspaceError(f"{path}: 'adapters' must map names to folders, e.g. 'v54: runs/v54'")
            bad = [short(k, 40) for k in adapters if not isinstance(k, str) or not re.fullmatch(NAME_RE, k)]
            if bad:
                raise WorkspaceError(f"{path}: adapter name(s) [{few(bad)}] must match {NAME_RE} (no '-' or spaces)")
            base = path.parent
            folders = {k: (base / safe_path(v, field=f"adapters.{k}", source=path)).resolve()
                       for k, v in adapters.items()}
            if data.get("base_model"):
                self.base_model = (base / safe_path(data["base_model"], field="base_model", source=path)).resolve()
        except ParseError as e:
            raise WorkspaceError(str(e)) from None
        self.file = path
        self.adapters = folders

    def path_of(self, name: str) -> Path:
        """The folder a name stands for."""
        if name in self.adapters:
            return self.adapters[name]
        p = (self.root / name).resolve()
        if not p.is_dir():
            where = f" in {self.file}" if self.file else " (no vecmerge.yaml here)"
            raise ExpressionError(f"{name!r} is not an adapter name{where} nor a folder in {self.root}; "
                                  f"add it under 'adapters:' in {WORKSPACE_NAME} or pass a folder")
        return p

    def adapter(self, name: str, modules_to_save: str = "refuse") -> Adapter:
        """Open (once per policy) the adapter a name stands for.

        Args:
            name (str): a workspace name or folder. modules_to_save (str): ``refuse`` or ``drop`` (see Adapter).
        """
        key = (self.path_of(name), modules_to_save)
        if key not in self._open:
            self._open[key] = Adapter(key[0], modules_to_save=modules_to_save)
        return self._open[key]

    def vector(self, name: str, modules_to_save: str = "refuse") -> TaskVector:
        """The task vector of one adapter, read onto the workspace's device."""
        return TaskVector.from_adapter(self.adapter(name, modules_to_save), self.device)

    def evaluate(self, expr, allow_missing: bool = False) -> TaskVector:
        """The task vector of an expression (string or LinearForm), exact, in float64 factors."""
        form = parse(expr) if isinstance(expr, str) else expr
        return evaluate_form(form, self, allow_missing)


def evaluate_form(form: LinearForm, ws: Workspace, allow_missing: bool = False) -> TaskVector:
    """``sum_i c_i * adapter_i`` per module by stacking; zero coefficients are dropped after alignment."""
    names = form.names()
    vecs = [ws.vector(n) for n in names]
    return linear_combination([(form.coeffs[n], v) for n, v in zip(names, vecs)], labels=names,
                              allow_missing=allow_missing)
