"""Writing outputs so that nothing is lost and nothing is half-written: stage, then commit all or none.

Every output is checked by ``policy.OutputPolicy`` and built in a hidden sibling ``.NAME.tmp-XXXXXXXX/`` (its
``new``, a ``.vecmerge-partial`` marker under ``flock``, a journal). A commit re-checks every target, journals
``committing``, moves each build in (``rename_noreplace``, or an atomic exchange over an old target), journals
``done``; a failure before that puts every member back (``recovery.undo``, or the next run's ``recover``).

    with OutputTransaction(policy) as txn:
        for dose in doses:                       # one output, or a ladder: all or none
            build_into(txn.folder(f"{out}-x{dose}"))
        txn.commit()

Re-exported here: ``OutputPolicy``, ``FileKind``, ``PNG``, ``recover``. The commit step by step and what two
``--force`` runs do: docs/design/outputs.md.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from ..errors import OutputError
from .policy import PNG, FileKind, OutputPolicy, is_kind, why_not_ours
from .recovery import (
    JOURNAL,
    NEW,
    OLD,
    file_id,
    locked_dirs,
    recover,
    remove_wrapper,
    signals_held,
    undo,
    write_json,
    write_marker,
)
from .rename import SwapUnsupported, exchange, fsync_path, fsync_tree, rename_noreplace

__all__ = ["PNG", "FileKind", "OutputPolicy", "OutputTransaction", "discard_folder", "recover", "write_file"]


def _checkpoint(step: str) -> None:
    """A no-op the tests replace to stop or kill the process at a named step of a write."""


class _Member:
    """One staged output: its final path, its wrapper, and how to re-check it at commit time."""

    def __init__(self, shown: Path, target: Path, wrapper: Path, flag: str, kind: FileKind | None, expected,
                 marker_fd):
        self.shown, self.target, self.wrapper, self.flag = shown, target, wrapper, flag
        self.kind, self.expected = kind, expected
        self.marker_fd, self.payload, self.replacing = marker_fd, wrapper / NEW, False

    @property
    def folder(self) -> bool:
        return self.kind is None


class OutputTransaction:
    """Outputs staged under one policy and committed together: all of them, or none.

    Use as a context manager; leaving the block without :meth:`commit` (an exception) removes every
    staged build; an OSError from the block (ENOSPC while writing) becomes one OutputError line.

    Args:
        policy (OutputPolicy): what may be written (protected paths, ``force``).
    """

    def __init__(self, policy: OutputPolicy):
        self.policy = policy
        self.members: list[_Member] = []
        self.state = "open"
        self.recovered: list[str] = []  # what recover() did to an earlier run's leftovers, one line each

    def __enter__(self) -> OutputTransaction:
        return self

    def __exit__(self, exc_type, exc, tb):
        if self.state == "open":
            self.abort()
        if isinstance(exc, OSError) and self.members:
            m = self.members[-1]
            raise OutputError(f"{m.flag} {m.shown}: cannot write it ({exc.strerror or exc}); nothing was written, "
                              f"free some space or fix the permissions, or choose another {m.flag}") from exc
        return False

    def folder(self, target, *, flag: str = "--out", expected_entries=None) -> Path:
        """Check ``target`` (``policy.check_folder``) and return the empty folder to build it in.

        Args:
            target (str | Path): the final folder. flag (str): for messages.
            expected_entries (Iterable[str] | None): see ``OutputPolicy.check_folder``.
        """
        expected = None if expected_entries is None else frozenset(expected_entries)
        return self._stage(target, flag, None, expected)

    def file(self, target, kind: FileKind, *, flag: str) -> Path:
        """Check ``target`` (``policy.check_file``) and return the (empty) file to write it as.

        Args:
            target (str | Path): the final file. kind (FileKind): PNG (or an export's own). flag (str): ``--plot``.
        """
        return self._stage(target, flag, kind, None)

    def _check(self, target: Path, flag: str, kind: FileKind | None, expected) -> None:
        if kind is None:
            self.policy.check_folder(target, flag=flag, expected_entries=expected)
        else:
            self.policy.check_file(target, kind, flag=flag)

    def _stage(self, target, flag: str, kind: FileKind | None, expected) -> Path:
        if self.state != "open":
            raise OutputError(f"{flag} {target}: this set of outputs was already {self.state}")
        shown = Path(target)
        target = Path(os.path.abspath(target))
        if not target.name:
            raise OutputError(f"{flag} {shown}: is the root folder; choose another {flag}")
        if any(m.target == target for m in self.members):
            raise OutputError(f"{flag} {shown}: given twice; give each output its own path")
        self._check(shown, flag, kind, expected)
        wrapper = None
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            self.recovered += recover(target.parent)
            wrapper = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
            journal = (self.members[0].wrapper if self.members else wrapper) / JOURNAL
            if kind is None:
                os.mkdir(wrapper / NEW)
            else:
                os.close(os.open(wrapper / NEW, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
            fd = write_marker(wrapper, {"tool": "vecmerge", "what": "an unfinished vecmerge output; the next "
                                         "vecmerge run writing here removes or restores it",
                                         "target": target.name, "journal": str(journal)})
        except BaseException as e:
            if wrapper is not None:  # no marker yet, or no lock: nobody else would ever remove it
                shutil.rmtree(wrapper, ignore_errors=True)
            if isinstance(e, OSError):
                raise OutputError(f"{flag} {shown}: cannot create it ({e.strerror or e}); choose another {flag}"
                                  ) from None
            raise
        self.members.append(_Member(shown, target, wrapper, flag, kind, expected, fd))
        _checkpoint("staged")
        return wrapper / NEW

    def abort(self) -> None:
        """Remove every staged build (nothing was moved in yet)."""
        for m in self.members:
            remove_wrapper(m.wrapper)
        self._release("aborted")

    def commit(self) -> list[Path]:
        """Move every staged build into place, all or none (see the module docstring). Returns the targets."""
        if self.state != "open":
            raise OutputError(f"these outputs were already {self.state}")
        try:
            for m in self.members:
                fsync_tree(m.payload)
                fsync_path(m.wrapper, directory=True)
            _checkpoint("built")
            with locked_dirs({m.target.parent for m in self.members}), signals_held():
                self._commit_locked()
        except BaseException as e:
            if self.state == "open":
                self.abort()
            if isinstance(e, OSError) and not isinstance(e, OutputError):
                m = self.members[0]
                raise OutputError(f"{m.flag} {m.shown}: cannot write it ({e.strerror or e}); nothing was "
                                  f"written, free some space or fix the permissions, or choose another {m.flag}"
                                  ) from e
            raise
        for m in self.members[1:] + self.members[:1]:  # the journal's wrapper last
            remove_wrapper(m.wrapper)
        self._release("committed")
        return [m.target for m in self.members]

    def _commit_locked(self) -> None:
        for m in self.members:
            m.replacing = os.path.lexists(m.target)
            if m.replacing:
                if not self.policy.force:
                    raise _appeared(m)
                self._check(m.shown, m.flag, m.kind, m.expected)
        journal = self.members[0].wrapper / JOURNAL
        plan = [{"target": str(m.target), "wrapper": str(m.wrapper), "new": list(_staged_id(m.payload))}
                for m in self.members]
        write_json(journal, {"state": "committing", "members": plan})
        _checkpoint("journal")
        try:
            for m in self.members:
                self._move_in(m)
                fsync_path(m.target.parent, directory=True)
                _checkpoint(f"moved {m.target.name}")
            write_json(journal, {"state": "done", "members": plan})
        except BaseException as e:
            failed = []
            for m, p in reversed(list(zip(self.members, plan))):
                try:
                    undo(m.target, m.wrapper, tuple(p["new"]))
                except BaseException as e2:  # noqa: B036 (a second fault: keep everything for recover())
                    failed.append((m, e2))
            if failed:
                self._release("failed")
                m, second = failed[0]
                raise OutputError(f"{m.flag} {m.shown}: writing failed ({e}) and restoring the old output failed "
                                  f"too ({second}); it is kept in {m.wrapper}, and the next vecmerge run writing to "
                                  f"{m.target.parent} restores it") from e
            raise
        _checkpoint("done")

    def _move_in(self, m: _Member) -> None:
        if not m.replacing:
            try:
                rename_noreplace(m.payload, m.target)
            except FileExistsError:
                raise _appeared(m) from None
            return
        try:
            exchange(m.payload, m.target)
        except FileNotFoundError:  # removed since the check: nothing to replace any more
            m.replacing = False
            return self._move_in(m)
        except SwapUnsupported:
            return _move_aside_then_in(m)
        if _changed(m):  # what was swapped out is not what the check allowed: put it back
            exchange(m.payload, m.target)
            raise _changed_error(m)

    def _release(self, state: str) -> None:
        for m in self.members:
            if m.marker_fd is not None:
                os.close(m.marker_fd)
                m.marker_fd = None
        self.state = state


def _staged_id(payload: Path) -> tuple[int, int]:
    """(device, inode) of a staged payload, which exists until the commit moves it."""
    found = file_id(payload)
    if found is None:
        raise OutputError(f"{payload}: the staged output vanished before the commit; run again")
    return found


def _appeared(m: _Member) -> OutputError:
    return OutputError(f"{m.flag} {m.shown}: appeared while vecmerge was writing (another run?) and was left as "
                       f"is; pass --force to replace it, or choose another {m.flag}")


def _changed(m: _Member, old: Path | None = None) -> bool:
    """The old output, now at ``old`` (after a swap: ``m.payload``): is it no longer something we may replace?"""
    old = m.payload if old is None else old
    if os.path.islink(old):
        return True
    if m.kind is None:  # a folder
        return not old.is_dir() or why_not_ours(old, m.expected) is not None
    return not old.is_file() or not is_kind(old, m.kind)


def _changed_error(m: _Member) -> OutputError:
    return OutputError(f"{m.flag} {m.shown}: changed while vecmerge was writing; it was left as is, "
                       f"run again or choose another {m.flag}")


def _move_aside_then_in(m: _Member) -> None:
    """No atomic swap here: keep the old output in the wrapper as ``old``, then move the new one in.

    What was set aside is checked as a swapped-out one is: if it is no longer what the check allowed, the
    commit fails and ``undo`` puts it back (a hard-linked file never left its path).
    """
    old = m.wrapper / OLD
    linked = False
    if not m.folder:  # a file: a hard link keeps the old content, and os.replace never leaves the path absent
        try:
            os.link(m.target, old, follow_symlinks=False)
            linked = True
        except OSError:
            pass
    if not linked:
        os.rename(m.target, old)
    if _changed(m, old):
        raise _changed_error(m)
    _checkpoint("aside")
    if linked:
        os.replace(m.payload, m.target)
    else:
        rename_noreplace(m.payload, m.target)


def write_file(target, data, *, policy: OutputPolicy, kind: FileKind, flag: str) -> Path:
    """Write one file atomically under ``policy``: refused, or complete, never half-written.

    Args:
        target (str | Path): the final file. data (bytes | Callable[[BinaryIO], None]): the content,
            or a function writing it to a binary file object (``lambda f: fig.savefig(f, format="png")``).
        policy (OutputPolicy): what may be written. kind (FileKind): PNG. flag (str): ``--plot``.
    """
    with OutputTransaction(policy) as txn:
        staged = txn.file(target, kind, flag=flag)
        with open(staged, "wb") as f:
            if callable(data):
                data(f)
            else:
                f.write(data)
        txn.commit()
    return Path(target)


def discard_folder(target, *, policy: OutputPolicy, flag: str = "--out") -> None:
    """Delete an old output folder that ``policy`` allows to replace, crash-safely.

    For outputs built in place (the demo, whose runs record their own paths): the folder is first
    renamed into a marked wrapper, so an interrupted deletion is finished by the next run's
    :func:`recover` and never leaves a half-deleted folder at ``target``.

    Args:
        target (str | Path): the folder. policy (OutputPolicy): must allow it (``force``, vecmerge's own).
        flag (str): for messages.
    """
    target = Path(os.path.abspath(target))
    policy.check_folder(target, flag=flag)
    if not os.path.lexists(target):
        return
    recover(target.parent)
    try:
        wrapper = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
        fd = write_marker(wrapper, {"tool": "vecmerge", "what": "an old vecmerge output being deleted",
                                    "target": target.name, "journal": str(wrapper / JOURNAL)})
    except OSError as e:
        raise OutputError(f"{flag} {target}: cannot replace it ({e.strerror or e}); remove it yourself") from None
    try:
        try:
            os.rename(target, wrapper / OLD)
        except OSError as e:
            remove_wrapper(wrapper)
            raise OutputError(f"{flag} {target}: cannot replace it ({e.strerror or e}); remove it yourself") from None
        fsync_path(target.parent, directory=True)
        _checkpoint("discarded")
        remove_wrapper(wrapper)
    finally:
        os.close(fd)
