"""Leftovers of interrupted writes: recognise them, then remove them or put the old outputs back.

A leftover is a hidden folder ``.NAME.tmp-XXXXXXXX`` (see :mod:`vecmerge.outputs.transaction`) that holds a
marker file ``.vecmerge-partial`` with ``"tool": "vecmerge"``, and whose marker no live process holds
an ``flock`` on. Nothing else is ever touched: not a folder of that name without the marker, not a
marker that some process still holds, not a symbolic link.

:func:`recover` reads the leftover's journal (``journal.json`` in the first wrapper of the commit):

* no journal: the run died before committing anything; the wrapper holds only a partial build and is
  removed;
* state ``committing``: the run died in the middle of a commit; every member of that commit is put back
  (:func:`undo`: the old output returns to its final path, or the new one leaves), then removed;
* state ``done``: the commit happened; the wrappers hold only old outputs and are removed.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import threading
from pathlib import Path

from ..io.parse import ParseError, load_json
from .rename import SwapUnsupported, exchange, fsync_path, rename_noreplace

try:
    import fcntl
except ImportError:  # Windows: no flock, so a leftover cannot be told dead; recover() leaves them all
    fcntl = None  # type: ignore[assignment]

PARTIAL_MARKER = ".vecmerge-partial"
STAGE_RE = re.compile(r"\.(?P<name>.+)\.tmp-[A-Za-z0-9_]+")
NEW, OLD, UNDONE, JOURNAL = "new", "old", "undone", "journal.json"
_HELD = tuple(getattr(signal, s) for s in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, s))


def recover(parent) -> list[str]:
    """Remove or restore every dead leftover in the folder ``parent``; returns what was done, one line each.

    Args:
        parent (str | Path): the folder an output is about to be written into.
    """
    done: list[str] = []
    if fcntl is None:
        return done
    try:
        entries = sorted(os.scandir(parent), key=lambda e: e.name)
    except OSError:
        return done
    for entry in entries:
        if STAGE_RE.fullmatch(entry.name) and entry.is_dir(follow_symlinks=False):
            try:
                done += _recover_one(Path(entry.path))
            except OSError as e:  # leave it; the write that called us goes on
                done.append(f"could not clean up {entry.path} ({e.strerror or e}); it was left as is")
    return done


def _recover_one(wrapper: Path) -> list[str]:
    info = read_marker(wrapper)
    if info is None:
        return []
    locks = {wrapper: try_lock(wrapper / PARTIAL_MARKER)}
    if locks[wrapper] is None:  # its run is alive
        return []
    try:
        journal = Path(info["journal"])
        if not os.path.lexists(journal):  # nothing was committed: a partial build (or one being discarded)
            with locked_dirs({wrapper.parent}):
                remove_wrapper(wrapper)
            return [f"removed the unfinished output {wrapper}"]
        plan = _read_journal(journal, wrapper)
        if plan is None:  # a journal we cannot trust: the wrapper may hold an old output, so keep it all
            return [f"left {wrapper} as is: its journal {journal} is not one vecmerge wrote; inspect it"]
        members = [(Path(m["target"]), Path(m["wrapper"]), tuple(m["new"])) for m in plan["members"]]
        for _, w, _ in members:
            if w not in locks and read_marker(w) is not None:
                locks[w] = try_lock(w / PARTIAL_MARKER)
                if locks[w] is None:
                    return []
        lines = []
        with locked_dirs({t.parent for t, _, _ in members}), signals_held():
            live = [(t, w, n) for t, w, n in members if w in locks]
            if plan["state"] != "done":
                for target, w, new_id in reversed(live):  # an OSError here keeps every wrapper for a retry
                    if undo(target, w, new_id):
                        lines.append(f"restored {target} (a commit of vecmerge was interrupted)")
            order = [x for x in live if x[1] != journal.parent] + [x for x in live if x[1] == journal.parent]
            for _, w, _ in order:
                remove_wrapper(w)
                lines.append(f"removed the leftover {w}")
        return lines
    finally:
        for fd in locks.values():
            if fd is not None:
                os.close(fd)


def _read_journal(journal: Path, wrapper: Path) -> dict | None:
    """The journal a marker names, if it is well formed and lists ``wrapper``; else None."""
    if journal.name != JOURNAL or not STAGE_RE.fullmatch(journal.parent.name) or not journal.is_file():
        return None
    try:
        plan = load_json(journal, max_bytes=1 << 20)
        members = plan["members"]
        ok = plan["state"] in ("committing", "done") and all(
            Path(m["wrapper"]).parent == Path(m["target"]).parent
            and _stage_name(Path(m["wrapper"]).name) == Path(m["target"]).name
            and len(m["new"]) == 2 for m in members) and str(wrapper) in [m["wrapper"] for m in members]
    except (ParseError, KeyError, TypeError, AttributeError):
        return None
    return plan if ok else None


def undo(target: Path, wrapper: Path, new_id: tuple) -> bool:
    """Put back what ``target`` held before a commit, whatever step it stopped at; True if it moved.

    The build is recognised by its (device, inode), which renames keep: if ``target`` is the build, the
    old output (in the wrapper as ``old``, or as ``new`` after a swap) goes back, atomically where it can.

    Args:
        target (Path): the final path. wrapper (Path): its ``.NAME.tmp-*`` folder.
        new_id (tuple[int, int]): (device, inode) of the build when the commit started.
    """
    new_p, old_p, undone = wrapper / NEW, wrapper / OLD, wrapper / UNDONE
    old = old_p if os.path.lexists(old_p) else (new_p if file_id(new_p) not in (None, new_id) else None)
    if file_id(target) == new_id:
        if old is None:
            os.rename(target, undone)
        elif old == new_p:
            try:
                exchange(new_p, target)
            except SwapUnsupported:
                os.rename(target, undone)
                rename_noreplace(new_p, target)
        elif not os.path.isdir(old):
            os.replace(old, target)
        else:
            os.rename(target, undone)
            rename_noreplace(old, target)
        fsync_path(target.parent, directory=True)
        return True
    if not os.path.lexists(target) and old is not None:
        rename_noreplace(old, target)
        fsync_path(target.parent, directory=True)
        return True
    return False


# ------------------------------------------------------------------------------- shared primitives
def _stage_name(name: str) -> str | None:
    """The target's name a staging wrapper's name carries (``.NAME.tmp-XXXX``), or None."""
    m = STAGE_RE.fullmatch(name)
    return None if m is None else m.group("name")


def file_id(path) -> tuple[int, int] | None:
    """(device, inode) of ``path`` itself (a link is not followed), or None if it does not exist."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def read_marker(wrapper: Path) -> dict | None:
    """The marker of a vecmerge wrapper folder, or None if ``wrapper`` is not one."""
    marker = wrapper / PARTIAL_MARKER
    if not STAGE_RE.fullmatch(wrapper.name) or wrapper.is_symlink() or marker.is_symlink() or not marker.is_file():
        return None
    try:
        info = load_json(marker, max_bytes=1 << 16)
    except ParseError:
        return None
    if not isinstance(info, dict) or info.get("tool") != "vecmerge" or not isinstance(info.get("journal"), str):
        return None
    if _stage_name(wrapper.name) != info.get("target"):
        return None
    return info


def write_marker(wrapper: Path, info: dict) -> int:
    """Create ``wrapper``'s marker, locked; returns the open descriptor that holds the lock.

    The marker is written under another name and renamed, so a marker that exists is always complete
    and already locked by its owner.
    """
    tmp = wrapper / (PARTIAL_MARKER + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, (json.dumps(info) + "\n").encode())
        os.fsync(fd)
        os.rename(tmp, wrapper / PARTIAL_MARKER)
        fsync_path(wrapper, directory=True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def try_lock(path: Path) -> int | None:
    """An open descriptor holding an exclusive flock on ``path``, or None if another process holds one."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def write_json(path: Path, data: dict) -> None:
    """Write ``path`` atomically and durably (temp file, fsync, rename, fsync of the folder)."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.write(json.dumps(data) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_path(path.parent, directory=True)


def remove_wrapper(wrapper: Path) -> None:
    """Delete a wrapper folder, its marker last, so that a crash midway leaves it recognisable."""
    try:
        names = os.listdir(wrapper)
    except FileNotFoundError:
        return
    for name in sorted(names, key=lambda n: n == JOURNAL):  # the journal last but for the marker
        if name == PARTIAL_MARKER:
            continue
        p = wrapper / name
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            p.unlink()
    with contextlib.suppress(FileNotFoundError):
        (wrapper / PARTIAL_MARKER).unlink()
    os.rmdir(wrapper)


@contextlib.contextmanager
def locked_dirs(folders):
    """Hold an exclusive ``flock`` on each folder (sorted, so two runs cannot deadlock); an extra guard."""
    fds = []
    try:
        for folder in sorted({os.path.realpath(f) for f in folders}):
            if fcntl is None:
                break
            try:
                fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
            except OSError:
                continue
            fds.append(fd)
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        for fd in fds:
            os.close(fd)


@contextlib.contextmanager
def signals_held():
    """Hold SIGINT, SIGTERM and SIGHUP until the block ends; they are delivered then, not lost.

    In the main thread the handlers are swapped for one that records the signal, and each recorded
    signal is raised again afterwards (a mask alone would not do: another thread, such as a BLAS pool,
    would take the signal and Python would still run the handler in the main thread). Elsewhere the
    signals are masked for this thread (``pthread_sigmask``), which is the best Python allows there.
    """
    if threading.current_thread() is not threading.main_thread():
        if not hasattr(signal, "pthread_sigmask"):
            yield
            return
        old = signal.pthread_sigmask(signal.SIG_BLOCK, _HELD)
        try:
            yield
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)
        return
    pending: list[int] = []
    previous = {}
    for sig in _HELD:
        if signal.getsignal(sig) is not None:  # None: a handler set outside Python, which we could not restore
            previous[sig] = signal.signal(sig, lambda signum, frame: pending.append(signum))
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for sig in dict.fromkeys(pending):
            signal.raise_signal(sig)
