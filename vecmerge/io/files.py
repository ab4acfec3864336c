"""Opening a stranger's file for reading: regular files only, refused before they are opened otherwise.

The one rule every reader of input files goes through:

- ``open_regular(path)``: ``os.stat`` refuses anything but a regular file; the open is non-blocking and
  ``fstat`` checks the opened file again before it is handed back as a blocking binary file object;
- ``check_regular(path)``: the same refusal for a path another library opens (SQLite, transformers);
- ``check_folder(folder)``: every top-level entry of a folder a library picks files from is a regular file
  or a folder.

A missing path is left to the caller, so each reader keeps its own "no such file" message.
Why (a FIFO hung ``fuse``), and who calls it: docs/design/io.md.
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
