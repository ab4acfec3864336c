"""Names to folders: a ``vecmerge.yaml`` workspace, and evaluating expressions to task vectors.

``vecmerge.yaml``::

    base_model: base                          # optional: a local transformers folder
    adapters:
      v54: runs/v54/checkpoint-3
      v51: {path: runs/v51, parent: v28}      # lineage: v51 was trained on from v28
      v54b: {path: runs/v54-seed2, replicate_of: v54}   # another training of v54's configuration
    evidence: vecmerge-evidence.db            # optional: the evaluation ledger (this is the default)

Paths are relative to the workspace file; a name not listed is a folder of that name in the current
directory. An adapter written by vecmerge takes its parent from its manifest unless the entry declares one.
Every key (``base_model_id``, ``metric``, ``gate``...) and replicate groups: docs/design/workspace.md.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path

from ..errors import AdapterError, ExpressionError, VecmergeError, WorkspaceError, few
from ..expr import NAME_RE, LinearForm, parse
from ..io.files import check_regular
from ..io.parse import ParseError, load_yaml, safe_path, short
from ..linalg.lowrank import resolve_device
from ..options import is_hub_id
from ..outputs.manifest import read_manifest
from ..peft.adapter import Adapter
from ..peft.content_hash import folder_content_sha256
from .lineage import chain
from .taskvector import TaskVector, linear_combination

WORKSPACE_NAME = "vecmerge.yaml"
WORKSPACE_MAX_BYTES = 1 << 20
LEDGER_NAME = "vecmerge-evidence.db"
_KEYS = ("adapters", "base_model", "base_model_id", "evidence", "metric", "gate")
_ENTRY_KEYS = ("path", "parent", "replicate_of")
# The entry keys that name another adapter (or null), in checking order: what the name means, and the words
# for an entry naming itself.
_NAME_KEYS = {"replicate_of": (" (the training this one repeats with another seed)", "is itself"),
              "parent": (", or null for a model trained straight from the base model", "is its own parent")}
UNREADABLE = "unreadable"  # current_shas' value for an entry whose files cannot be hashed


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
        self.parents: dict[str, str | None] = {}  # declared parent: keys; None = a declared root
        self.replicate_of: dict[str, str] = {}  # declared replicate_of: keys
        self.base_model: Path | None = None
        self.base_model_id: str | None = None
        self.file: Path | None = None
        self.evidence: Path | None = None
        self.metric: str | None = None
        self.gate: dict | None = None  # the raw gate: section (evidence.gate.GateConfig.from_dict reads it)
        self.device = resolve_device(device) if device is not None else None
        check_regular(self.root / WORKSPACE_NAME)
        if path is None and (self.root / WORKSPACE_NAME).is_file():
            path = self.root / WORKSPACE_NAME
        if path is not None:
            self._load(Path(path))
        self._open: dict[tuple, Adapter] = {}
        self._sha: dict[str, str | None] = {}
        self.dora_base: Path | None = None  # the base model DoRA inputs are read against (a recipe's base_model)
        self.lora_bias = False  # lora_bias adapters are read (by the pipeline, which merges their biases)

    def with_biases(self) -> Workspace:
        """A copy that opens ``lora_bias`` adapters (others refuse them: they would drop the bias)."""
        ws = copy.copy(self)
        ws.lora_bias = True
        return ws

    def with_dora_base(self, base) -> Workspace:
        """A copy that reads DoRA adapters as their effective update against the base model folder ``base``."""
        ws = copy.copy(self)
        ws.dora_base = Path(base).resolve() if base is not None else None
        ws._open = {}
        return ws

    def with_inputs(self, inputs: dict) -> Workspace:
        """A copy in which the names of ``inputs`` ({name: path}) resolve to those paths (a recipe's pins)."""
        ws = copy.copy(self)
        ws.adapters = {**self.adapters, **{n: Path(p).resolve() for n, p in inputs.items()}}
        ws._sha = {}
        return ws

    def _load(self, path: Path) -> None:
        check_regular(path)
        if not path.is_file():
            raise WorkspaceError(f"{path}: no such workspace file; create it or drop --workspace")
        try:  # bounded, UTF-8, no anchors or aliases (an alias bomb is refused before it expands)
            data = load_yaml(path, max_bytes=WORKSPACE_MAX_BYTES)
        except ParseError as e:
            raise WorkspaceError(str(e)) from None
        data = {} if data is None else data
        if not isinstance(data, dict):
            raise WorkspaceError(f"{path}: expected a mapping with an 'adapters' key")
        unknown = [short(k, 40) for k in data if k not in _KEYS]
        if unknown:
            raise WorkspaceError(f"{path}: unknown key(s) [{few(unknown)}]; expected {', '.join(_KEYS)}")
        adapters = data.get("adapters") or {}
        if not isinstance(adapters, dict):
            raise WorkspaceError(f"{path}: 'adapters' must map names to folders, e.g. 'v54: runs/v54'")
        bad = [short(k, 40) for k in adapters if not isinstance(k, str) or not re.fullmatch(NAME_RE, k)]
        if bad:
            raise WorkspaceError(f"{path}: adapter name(s) [{few(bad)}] must match {NAME_RE}: ASCII letters, digits, "
                                 "'_' and '.' only, not starting with a digit (expressions such as 'v51 - v28' read "
                                 "them); rename them, e.g. v51")
        self.file = path
        base = path.parent
        problems: list[str] = []
        for k, v in adapters.items():
            entry = _entry(str(k), v, problems)
            if entry is None:
                continue
            try:
                folder = safe_path(entry["path"], field=f"adapters.{k}", source=path)
            except ParseError as e:
                problems.append(e.problem)
                continue
            self.adapters[str(k)] = (base / folder).resolve()
            if "parent" in entry:
                self.parents[str(k)] = entry["parent"]
            if entry.get("replicate_of") is not None:
                self.replicate_of[str(k)] = entry["replicate_of"]
        for k, of in self.replicate_of.items():
            if of not in self.adapters:
                problems.append(f"adapters.{k}: replicate_of: {of} is not an adapter of this workspace; name the "
                                "entry whose configuration this training repeats")
        for key in ("evidence", "metric"):
            v = data.get(key)
            if v is not None and (not isinstance(v, str) or not v.strip()):
                problems.append(f"{key}: {v!r} must be a {'metric name' if key == 'metric' else 'file path'}")
        if data.get("gate") is not None and not isinstance(data["gate"], dict):
            problems.append(f"gate: {data['gate']!r} must be a mapping of thresholds, e.g. {{min_repeats: 3}}")
        if problems:
            head = problems[0] if len(problems) == 1 else f"{len(problems)} problems: " + "; ".join(problems)
            raise WorkspaceError(f"{path}: {head}")
        try:
            if data.get("base_model"):
                self.base_model = (base / safe_path(data["base_model"], field="base_model", source=path)).resolve()
            if data.get("evidence"):
                self.evidence = (base / safe_path(data["evidence"], field="evidence", source=path)).resolve()
        except ParseError as e:
            raise WorkspaceError(str(e)) from None
        hub = data.get("base_model_id")
        if hub is not None:
            if not is_hub_id(hub):
                raise WorkspaceError(f"{path}: base_model_id {hub!r} is not a hub id; write it as ORG/NAME, "
                                     "e.g. Qwen/Qwen3-0.6B (the local folder goes under base_model)")
            self.base_model_id = hub
        self.metric = data.get("metric")
        self.gate = data.get("gate")

    @property
    def home(self) -> Path:
        """The folder the workspace's relative paths start from: the workspace file's, else ``root``."""
        return self.file.parent.resolve() if self.file is not None else self.root.resolve()

    @property
    def ledger_path(self) -> Path:
        """The evaluation ledger: ``evidence:``, else ``vecmerge-evidence.db`` beside the workspace file
        (in ``root`` without one)."""
        if self.evidence is not None:
            return self.evidence
        return (self.file.parent if self.file else self.root) / LEDGER_NAME

    def content_sha(self, name: str) -> str | None:
        """The current content sha256 (weights and config, ``adapter.content_sha256``) of what ``name`` is.

        A workspace entry must be readable (AdapterError otherwise); another name is hashed when it is
        a folder holding an adapter config, and is None otherwise (scores of weights not on disk).
        """
        if name not in self._sha:
            if name in self.adapters:
                self._sha[name] = folder_content_sha256(self.adapters[name])
            else:
                p = self.root / name
                self._sha[name] = folder_content_sha256(p) if (p / "adapter_config.json").is_file() else None
        return self._sha[name]

    def current_shas(self, names) -> dict[str, str | None]:
        """``content_sha`` of each name for the ledger's stale rule; an entry whose adapter cannot be read maps
        to ``UNREADABLE``, so none of its records counts as current (they cannot be tied to its weights)."""
        out = {}
        for name in names:
            try:
                out[name] = self.content_sha(name)
            except VecmergeError:
                out[name] = UNREADABLE
        return out

    def replicate_groups(self) -> dict[str, tuple[str, ...]]:
        """Replicate groups: each entry that others name in ``replicate_of:`` (followed to the first that names
        none) -> itself and its replicates, in workspace order. Raises LineageError naming a cycle."""
        groups: dict[str, list[str]] = {}
        for name in self.replicate_of:
            root = chain(name, self.replicate_of, what="replicate_of")[-1]
            groups.setdefault(root, [root]).append(name)
        order = list(self.adapters)
        return {root: tuple(sorted(set(m), key=order.index)) for root, m in groups.items()}

    def lineage(self, names=()) -> tuple[dict[str, str | None], set[str]]:
        """``(parents, roots)`` of the workspace's entries and ``names``, for ``evidence.lineage.relation``.

        A declared ``parent:`` wins; an adapter written by vecmerge without one takes the backbone of its
        manifest's recipe (``base``, when it is one adapter name), and that parent is looked up in turn.
        ``roots`` are the entries that declare ``parent: null``. Every reader of lineage gets it through here,
        so a cycle of parents is refused for all of them (LineageError naming the cycle).
        """
        parents: dict[str, str | None] = {n: p for n, p in self.parents.items() if p is not None}
        roots = {n for n, p in self.parents.items() if p is None}
        todo, seen = [*self.adapters, *names], set()
        while todo:
            name = todo.pop(0)
            if name in seen or name in self.parents:
                seen.add(name)
                continue
            seen.add(name)
            parent = self._manifest_parent(name)
            if parent is not None:
                parents[name] = parent
                todo.append(parent)
        for name in [*names, *parents]:  # a cycle is named from the first name asked about
            chain(name, parents)
        return parents, roots

    def _manifest_parent(self, name: str) -> str | None:
        """The backbone a vecmerge output was made from (its manifest's ``recipe.base``), or None."""
        try:
            folder = self.path_of(name)
        except ExpressionError:
            return None
        try:
            manifest = read_manifest(folder)  # bounded and strict: a stranger may have written it
            base = manifest["recipe"]["base"]
            form = parse(str(base))
        except (VecmergeError, KeyError, TypeError):
            return None
        names = form.names()
        return names[0] if len(names) == 1 and form.coeffs[names[0]] == 1.0 and names[0] != name else None

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
        dora = self.dora_base is not None
        key = (self.path_of(name), modules_to_save, dora)
        if key not in self._open:
            self._open[key] = Adapter(key[0], modules_to_save=modules_to_save, dora=dora)
        if self._open[key].bias_keys and not self.lora_bias:
            raise AdapterError(f"{key[0]}: lora_bias is set: its trained bias is not part of B@A and this command "
                               "would drop it; project, refactor, merge and run read it (its bias is merged too)")
        return self._open[key]

    def vector(self, name: str, modules_to_save: str = "refuse") -> TaskVector:
        """The task vector of one adapter, read onto the workspace's device (a DoRA adapter: its effective
        update against ``dora_base``, exact, see ``dora.py``)."""
        a = self.adapter(name, modules_to_save)
        if a.config.use_dora:
            from .dora import dora_modules

            return TaskVector(dora_modules(a, self.dora_base, self.device), dict(a.specs))
        return TaskVector.from_adapter(a, self.device)

    def evaluate(self, expr, allow_missing: bool = False, modules_to_save: str = "refuse") -> TaskVector:
        """The task vector of an expression (string or LinearForm), exact, in float64 factors."""
        form = parse(expr) if isinstance(expr, str) else expr
        return evaluate_form(form, self, allow_missing, modules_to_save)


def _entry(name: str, value, problems: list) -> dict | None:
    """``{"path"[, "parent"]}`` of one ``adapters:`` entry (``runs/v51`` or ``{path: runs/v51, parent: v28}``)."""
    if isinstance(value, str) and value.strip():
        return {"path": value}
    if not isinstance(value, dict):
        problems.append(f"adapters.{name}: {value!r} must be a folder, or {{path: FOLDER, parent: NAME}}")
        return None
    unknown = sorted(set(map(str, value)) - set(_ENTRY_KEYS))
    if unknown:
        problems.append(f"adapters.{name}: unknown key(s) {unknown} (use path, parent and replicate_of)")
    path = value.get("path")
    if not isinstance(path, str) or not path.strip():
        problems.append(f"adapters.{name}: path: {path!r} must be a folder")
        return None
    out: dict[str, str | None] = {"path": path}
    for key, (what, itself) in _NAME_KEYS.items():
        if key not in value:
            continue
        other = value[key]
        if other is not None and not (isinstance(other, str) and re.fullmatch(NAME_RE, other)):
            problems.append(f"adapters.{name}: {key}: {other!r} must be an adapter name{what}")
            return None
        if other == name:
            problems.append(f"adapters.{name}: {key}: {name} {itself}")
            return None
        out[key] = other
    return out


def evaluate_form(form: LinearForm, ws: Workspace, allow_missing: bool = False,
                  modules_to_save: str = "refuse") -> TaskVector:
    """``sum_i c_i * adapter_i`` per module by stacking; zero coefficients are dropped after alignment."""
    names = form.names()
    vecs = [ws.vector(n, modules_to_save) for n in names]
    return linear_combination([(form.coeffs[n], v) for n, v in zip(names, vecs)], labels=names,
                              allow_missing=allow_missing)
