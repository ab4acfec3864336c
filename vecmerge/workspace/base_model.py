"""Which base model an adapter belongs to: the declared name, compared sensibly, and model folders.

Shapes alone do not show that a sum of adapters means anything (a Llama and a Mistral of one size share them),
so the ``base_model_name_or_path`` they declare must agree too:

- ``canonical(name, roots)``: the one normaliser (a local folder: its resolved path; else the text, trailing
  ``/`` removed); two names are one base model when their canonical forms are equal;
- ``declared_base``: the canonical form as the gate and ``ls`` show it;
- ``same_base_model``: refuses differing base models (``AlignmentError``) unless ``--allow-base-mismatch``;
- ``model_folder_problem``: what keeps a folder from being a transformers model (``verify --base-model``);
- ``folder_is``: whether a local folder is the declared base model (itself, a hub cache snapshot, the
  workspace's id); ``layers_without_bias``: which layers a local model folder holds without a bias.

The rules in full: docs/design/workspace.md.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import AlignmentError, UsageError, VecmergeError, few
from ..io.files import check_folder
from ..io.model_folder import ModelFolder

MODEL_WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                 "pytorch_model.bin.index.json")
ALLOW_FLAG = "--allow-base-mismatch"


def canonical(name, roots=()) -> str | None:
    """The comparable form of a declared base model: a resolved path for a local folder, else the text.

    Args:
        name (str | Path | None): ``base_model_name_or_path`` as declared (None or empty: undeclared).
        roots (iterable[Path]): folders a relative path may start from when it is no folder from here
            (the workspace: PEFT records the path as the trainer typed it).
    """
    if name is None or not str(name).strip():
        return None
    text = str(name).strip()
    path = Path(text).expanduser()
    if path.is_absolute() or path.is_dir():
        return str(path.resolve())
    for root in roots:
        if (Path(root) / path).is_dir():
            return str((Path(root) / path).resolve())
    return text.rstrip("/") or text


def declared_base(name, roots=()) -> str | None:
    """A declared base model as compared and shown: ``canonical(name, roots)``, a local folder relative to the
    current folder when it lies below it (so ``base``, ``./base`` and ``/abs/demo/base`` show as one model).

    Args:
        name (str | None): ``base_model_name_or_path`` as declared. roots (iterable[Path]): as ``canonical``.
    """
    key = canonical(name, roots)
    if key is None or not Path(key).is_absolute():
        return key
    try:
        return str(Path(key).relative_to(Path.cwd().resolve()))
    except ValueError:
        return key


def same_base_model(adapters: dict, allow: bool = False, roots=()) -> dict[str, str | None]:
    """``{label: declared base model}``; AlignmentError when two declared ones differ and ``allow`` is False.

    Adapters that declare no base model are not compared (nothing to compare).

    Args:
        adapters (dict[str, Adapter]): label (a workspace name) -> opened adapter.
        allow (bool): combine them anyway (``--allow-base-mismatch``); the caller reports it.
        roots (iterable[Path]): where relative declared paths may start (see ``canonical``).
    """
    declared = {label: a.config.base_model for label, a in adapters.items()}
    if differ(declared, roots) and not allow:
        raise AlignmentError(f"{mismatch_text(declared, roots)}; adapters of different base models cannot be "
                             f"combined, even when their shapes match; pass {ALLOW_FLAG} (recipe: "
                             "allow_base_mismatch: true) only if these models really share their weights")
    return declared


def differ(declared: dict, roots=()) -> bool:
    """Whether ``{label: base model}`` names more than one base model (undeclared ones aside)."""
    return len({canonical(v, roots) for v in declared.values()} - {None}) > 1


def mismatch_text(declared: dict, roots=()) -> str:
    """``"the inputs declare different base models: v54, v51 name /m/llama; p2 names /m/mistral"``."""
    groups: dict[str, list[str]] = {}
    shown: dict[str, str] = {}
    for label, name in declared.items():
        key = canonical(name, roots)
        if key is not None:
            groups.setdefault(key, []).append(label)
            shown.setdefault(key, str(name))
    return "the inputs declare different base models: " + "; ".join(
        f"{few(labels)} {'names' if len(labels) == 1 else 'name'} {shown[k]}" for k, labels in groups.items())


def checked_model_folder(given, default, command: str) -> Path:
    """``--base-model`` if given, else the workspace's ``base_model``, checked to be a local transformers model.

    Args:
        given (str | Path | None): the flag's value. default (Path | None): the workspace's base model.
        command (str): the command named when neither is given. Raises UsageError naming the fix.
    """
    folder = Path(given) if given is not None else default
    if folder is None:
        raise UsageError(f"{command}: give --base-model DIR (or base_model: in vecmerge.yaml)")
    problem = model_folder_problem(folder)
    if problem:
        raise UsageError(f"--base-model {folder}: {problem}")
    return Path(folder)


def model_folder_problem(folder) -> str | None:
    """Why ``folder`` is not a local transformers model (None when it is: ``config.json`` and weights).

    Args:
        folder (str | Path): what the user gave as ``--base-model``.
    """
    folder = Path(folder)
    if not folder.is_dir():
        return "no such folder"
    check_folder(folder)  # transformers opens the files it picks: a FIFO among them would hang it
    if (folder / "adapter_config.json").is_file():
        return "it is a LoRA adapter folder (adapter_config.json), not a base model"
    if not (folder / "config.json").is_file():
        return "it has no config.json, so it is not a transformers model folder"
    if not any((folder / w).is_file() for w in MODEL_WEIGHTS) and not any(folder.glob("*.safetensors")):
        return f"it has a config.json but no weights ({', '.join(MODEL_WEIGHTS)})"
    return None


def folder_is(folder, declared, aliases: dict | None = None, roots=()) -> bool:
    """Whether the local model ``folder`` is the declared base model.

    True when the two are the same folder (a relative ``declared`` also read from each of ``roots``,
    e.g. the workspace an output was made in), or ``declared`` is a hub id ``ORG/NAME`` and ``folder``
    is a hub cache snapshot of it (a path component ``models--ORG--NAME``), or ``aliases`` ({local
    folder: hub id}, e.g. a workspace's ``base_model`` and ``base_model_id``) maps the folder to that id.

    Args:
        folder (str | Path): a local model folder. declared (str | None): ``base_model_name_or_path``.
        aliases (dict | None): local folder -> the hub id it is a copy of.
        roots (iterable[Path]): folders a relative declared path may start from (besides the current one).
    """
    key = canonical(declared)
    if key is None:
        return False
    here = str(Path(folder).resolve())
    if here == key:
        return True
    if not Path(str(declared)).expanduser().is_absolute():
        if any(str((Path(r) / str(declared).strip()).resolve()) == here for r in roots):
            return True
    if "models--" + key.replace("/", "--") in Path(here).parts:
        return True
    return any(canonical(local) == here and canonical(hub) == key for local, hub in (aliases or {}).items())


def layers_without_bias(folders: list, modules: list[str], roots=()) -> tuple[Path | None, list[str]]:
    """``(folder, [m])``: the first local model folder of ``folders`` and the modules m it holds as
    ``<m>.weight`` without a ``<m>.bias`` (safetensors headers only); ``(None, [])`` when none is readable.

    Args:
        folders (list): candidate base models (None, paths or declared names, as ``canonical`` reads them).
        modules (list[str]): layer names as PEFT names them (``model.layers.0.self_attn.q_proj``).
        roots (iterable[Path]): where a relative declared path starts (``canonical``).
    """
    local = [Path(c) for c in (canonical(f, roots) for f in folders if f) if c and Path(c).is_dir()]
    folder = next((f for f in local if model_folder_problem(f) is None), None)
    if folder is None:
        return None, []
    try:
        with ModelFolder(folder) as model:
            names = set(model.tensors)
    except VecmergeError:  # an unreadable model folder: verify --base-model names it
        return None, []
    return folder, [m for m in modules if f"{m}.weight" in names and f"{m}.bias" not in names]
