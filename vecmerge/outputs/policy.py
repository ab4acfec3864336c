"""Which paths vecmerge may write: one rule for every output folder and file (``--out``, ``--plot``...).

A target is refused (``errors.OutputError``, exit 2, one line naming it and the way out) when it is, holds
or lies inside a protected path (the inputs, the workspace's adapters and base model; compared as real
paths and by device and inode); when it is a symbolic link or not a regular file; when it exists without
``force``; with ``force``, when it is a folder vecmerge did not write or a file of another kind (checked by
content); and when it would land inside an adapter folder or a model folder (``MODEL_WEIGHTS``).
Each rule and why: docs/design/outputs.md.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from ..errors import OutputError, few
from ..io.parse import ParseError, load_json
from .manifest import MANIFEST_MAX_BYTES, MANIFEST_NAME, written_by_vecmerge

DEMO_MARKER = ".vecmerge-demo"
OWNER_MARKERS = (DEMO_MARKER,)
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors", "adapter_model.bin", MANIFEST_NAME)
MODEL_WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                 "pytorch_model.bin.index.json")
SNIFF_BYTES = 1 << 16


@dataclass(frozen=True)
class FileKind:
    """A kind of output file and how to recognise an existing one from its first bytes.

    Args:
        name (str): for messages (``"PNG image"``). sniff (Callable[[bytes], bool]): True if the
            first :data:`SNIFF_BYTES` bytes of a file are of this kind.
    """

    name: str
    sniff: Callable[[bytes], bool]


PNG = FileKind("PNG image", lambda head: head.startswith(b"\x89PNG\r\n\x1a\n"))  # --plot; a new export adds its kind
REPORT_MARK = "<!-- vecmerge report -->"  # the first line of both files vecmerge report writes
MARKDOWN_REPORT = FileKind("Markdown report vecmerge wrote", lambda head: head.startswith(REPORT_MARK.encode()))
HTML_REPORT = FileKind("HTML report vecmerge wrote",
                       lambda head: head.startswith(b"<!DOCTYPE html>\n" + REPORT_MARK.encode()))


@dataclass(frozen=True)
class Protected:
    """A path no output may be, contain, or lie inside. ``what`` names it in messages."""

    path: Path
    what: str


@dataclass(frozen=True)
class OutputPolicy:
    """Decides whether a target may be written; see the module docstring for the rule.

    Args:
        protected (tuple[Protected, ...]): inputs, workspace adapters, base model.
        force (bool): the user passed ``--force``.
    """

    protected: tuple = ()
    force: bool = False

    @classmethod
    def for_command(cls, *, inputs: Iterable = (), workspace_adapters: Mapping | None = None,
                    base_model=None, force: bool = False) -> OutputPolicy:
        """The policy of one command.

        Args:
            inputs (Iterable[str | Path] | Mapping[str, str | Path]): every folder or file the command
                reads (a mapping names them: name -> path).
            workspace_adapters (Mapping[str, Path] | None): the workspace's ``adapters`` (name -> folder).
            base_model (str | Path | None): the workspace's ``base_model`` folder.
            force (bool): ``--force``.
        """
        named = inputs.items() if isinstance(inputs, Mapping) else ((None, p) for p in inputs)
        prot = [Protected(Path(p), f"the input {p}" if n is None else f"the input {n} ({p})") for n, p in named]
        prot += [Protected(Path(p), f"the workspace adapter {name!r} ({p})")
                 for name, p in (workspace_adapters or {}).items()]
        if base_model is not None:
            prot.append(Protected(Path(base_model), f"the base model {base_model}"))
        return cls(protected=tuple(prot), force=force)

    def check_folder(self, target, *, flag: str = "--out", expected_entries: Iterable[str] | None = None) -> Path:
        """``target`` if it may be written as a folder, else OutputError (see the module docstring).

        Args:
            target (str | Path): the output folder. flag (str): the option that named it (for messages).
            expected_entries (Iterable[str] | None): the names an old output may hold to be replaced.
        """
        target = Path(target)
        self._common(target, flag)
        if not os.path.lexists(target):
            return target
        if not target.is_dir():
            raise OutputError(f"{flag} {target}: exists and is not a folder; choose another {flag}")
        if not self.force:
            raise OutputError(f"{flag} {target}: already exists; pass --force to replace it, or choose another {flag}")
        why = why_not_ours(target, expected_entries)
        if why:
            raise OutputError(f"{flag} {target}: exists and {why}; --force replaces only a folder vecmerge wrote, "
                              f"choose another {flag} or move it away yourself")
        return target

    def check_file(self, target, kind: FileKind, *, flag: str) -> Path:
        """``target`` if it may be written as a file of ``kind``, else OutputError.

        Args:
            target (str | Path): the output file. kind (FileKind): what it must be (PNG).
            flag (str): the option that named it (``--plot``).
        """
        target = Path(target)
        self._common(target, flag)
        try:
            st = os.lstat(target)
        except FileNotFoundError:
            return target
        if stat.S_ISDIR(st.st_mode):
            raise OutputError(f"{flag} {target}: is a folder; give a file name")
        if not stat.S_ISREG(st.st_mode):
            raise OutputError(f"{flag} {target}: exists and is not a regular file; choose another {flag}")
        if not self.force:
            raise OutputError(f"{flag} {target}: already exists; pass --force to replace it, or choose another {flag}")
        if not is_kind(target, kind):
            raise OutputError(f"{flag} {target}: exists and is not a {kind.name}; refusing to replace it even with "
                              f"--force, choose another {flag}")
        return target

    def _common(self, target: Path, flag: str) -> None:
        hit = protected_hit(target, self.protected)
        if hit:
            raise OutputError(f"{flag} {target}: {hit}, which vecmerge never writes; choose another {flag}")
        inside = adapter_above(target)
        if inside:
            folder, beside = inside
            raise OutputError(f"{flag} {target}: lies in an adapter folder (beside {beside} in {folder}), where it "
                              f"would be taken as part of the adapter; choose another {flag}")
        model = model_above(target)
        if model:
            folder, beside = model
            raise OutputError(f"{flag} {target}: lies in a model folder (beside {beside} in {folder}), which vecmerge "
                              f"never writes; choose another {flag}")
        if os.path.islink(target):
            raise OutputError(f"{flag} {target}: is a symbolic link, which vecmerge does not write through; "
                              f"choose another {flag}")


def protected_hit(target: Path, protected: Iterable[Protected]) -> str | None:
    """How ``target`` meets a protected path (``"is the input v28"``), or None if it does not."""
    t_real = Path(os.path.realpath(target))
    t_chain = _ids(target, ancestors=True)
    t_id = _id(target)
    for p in protected:
        p_real = Path(os.path.realpath(p.path))
        p_id = _id(p.path)
        if t_real == p_real or (p_id is not None and p_id == t_id):
            return f"is {p.what}"
        if t_real.is_relative_to(p_real) or (p_id is not None and p_id in t_chain):
            return f"lies inside {p.what}"
        if p_real.is_relative_to(t_real) or (t_id is not None and t_id in _ids(p.path, ancestors=True)):
            return f"contains {p.what}"
    return None


def adapter_above(target: Path) -> tuple[Path, str] | None:
    """The nearest folder above ``target`` that holds an adapter file, and that file; None if there is none."""
    for folder in Path(os.path.abspath(target)).parents:
        beside = next((n for n in ADAPTER_FILES if os.path.lexists(folder / n)), None)
        if beside:
            return folder, beside
    return None


def model_above(target: Path) -> tuple[Path, str] | None:
    """The nearest folder above ``target`` holding ``config.json`` and model weights, and that weights file; or None."""
    for folder in Path(os.path.abspath(target)).parents:
        if os.path.isfile(folder / "config.json"):
            beside = next((n for n in MODEL_WEIGHTS if os.path.lexists(folder / n)), None)
            if beside:
                return folder, beside
    return None


def why_not_ours(folder: Path, expected_entries: Iterable[str] | None = None) -> str | None:
    """Why ``folder`` may not be replaced (``"holds no vecmerge.json..."``), or None if vecmerge wrote it.

    Args:
        folder (Path): an existing folder. expected_entries (Iterable[str] | None): the only names it may hold.
    """
    owner_markers, manifest_name = OWNER_MARKERS, MANIFEST_NAME
    try:
        entries = os.listdir(folder)
    except OSError as e:
        return f"cannot be read ({e.strerror})"
    if not entries:
        return None
    folder = Path(folder)
    if any(os.path.isfile(folder / m) and not os.path.islink(folder / m) for m in owner_markers):
        return None
    manifest = folder / manifest_name
    if not manifest.is_file() or manifest.is_symlink():
        return f"holds no {manifest_name} (it was not written by vecmerge)"
    try:
        data = load_json(manifest, max_bytes=MANIFEST_MAX_BYTES)
    except ParseError as e:
        return f"its {manifest_name} is not readable ({e.problem})"
    if not written_by_vecmerge(data):
        return f"its {manifest_name} was not written by vecmerge"
    if expected_entries is not None:
        extra = sorted(set(entries) - set(expected_entries))
        if extra:
            return f"holds files vecmerge did not write ({few(extra)})"
    return None


def is_kind(path: Path, kind: FileKind) -> bool:
    """True if the regular file ``path`` starts like a ``kind`` file."""
    try:
        with open(path, "rb") as f:
            return kind.sniff(f.read(SNIFF_BYTES))
    except OSError:
        return False


def _id(path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    return st.st_dev, st.st_ino


def _ids(path, *, ancestors: bool) -> set:
    """(device, inode) of ``path`` and, with ``ancestors``, of every existing folder above it."""
    out = set()
    p = Path(os.path.abspath(path))
    for q in [p, *p.parents] if ancestors else [p]:
        i = _id(q)
        if i is not None:
            out.add(i)
    return out
