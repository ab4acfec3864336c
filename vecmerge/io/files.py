"""Opening a stranger's file for reading: regular files only, refused before they are opened otherwise.

A FIFO, a character or block device or a socket where vecmerge expects a file is never opened: opening a
FIFO blocks until a writer comes (``fuse`` hung forever on a base whose ``model.safetensors`` was one), and
reading a device may never end. This module is the one rule, and every reader of input files goes through it
(``io.parse``'s bounded JSON/YAML/JSONL, ``io.safetensors_read``, ``io.hashing``, model and adapter folders,
tokenizer folders, the evidence ledger and CSV imports):

- ``open_regular(path)``: ``os.stat`` (symbolic links followed) refuses anything but a regular file; the open
  itself is non-blocking (a FIFO swapped in after the stat cannot hang it) and ``fstat`` checks the opened
  file again before it is handed back, blocking, as a binary file object;
- ``check_regular(path)``: the same refusal for a path another library opens (SQLite, transformers), or one
  a caller tests with ``is_file`` (which is False for a FIFO, so the message would say "missing");
- ``check_folder(folder)``: every top-level entry of a folder handed to a library that picks its own files
  (a tokenizer or model folder for transformers) is a regular file or a folder.

A missing path is left to the caller (its ``OSError`` propagates, or ``check_regular`` returns), so each
reader keeps its own "no such file" message; a folder raises ``IsADirectoryError`` for the same reason.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from ..errors import SpecialFileError

KINDS = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
         (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def _kind(mode: int) -> str:
    return next((name for test, name in KINDS if test(mode)), "not a regular file")


def _refuse(path, mode: int) -> None:
    """SpecialFileError for a mode that is neither a regular file nor a folder; IsADirectoryError for a folder."""
    if stat.S_ISREG(mode):
        return
    if stat.S_ISDIR(mode):
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
    raise SpecialFileError(f"{path}: is {_kind(mode)}, not a regular file; vecmerge reads only regular files (a "
                           "pipe or device may block or never end): point at the file itself")


def open_regular(path, buffering: int = -1):
    """``path`` opened for binary reading, when it is a regular file (see the module docstring).

    Args:
        path (str | Path): the file. buffering (int): as ``open``'s.

    Returns:
        a binary file object; SpecialFileError for a FIFO, device or socket (never opened), IsADirectoryError
        for a folder, and the ``OSError`` of ``os.stat`` or ``os.open`` (missing, no permission) otherwise.
    """
    _refuse(path, os.stat(path).st_mode)
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        _refuse(path, os.fstat(fd).st_mode)
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb", buffering=buffering)
    except BaseException:
        os.close(fd)
        raise


def check_regular(path) -> None:
    """SpecialFileError when ``path`` exists and is a FIFO, device or socket (never opened); nothing for a
    regular file, a folder or a missing or unreadable path (its reader reports those)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return
    if not stat.S_ISDIR(mode):
        _refuse(path, mode)


def check_folder(folder) -> None:
    """SpecialFileError naming the first top-level entry of ``folder`` that is a FIFO, device or socket (for a
    folder another library reads files of its own choosing from, e.g. transformers' ``from_pretrained``)."""
    try:
        entries = sorted(Path(folder).iterdir())
    except OSError:
        return
    for p in entries:
        check_regular(p)
