"""Atomic renames that never replace by accident, atomic swaps, and ``fsync`` helpers.

POSIX ``rename`` silently replaces its destination. This module calls the systems' missing pieces through
``ctypes``: ``renameat2`` with ``RENAME_NOREPLACE`` / ``RENAME_EXCHANGE`` (Linux 3.15+) and ``renamex_np``
with ``RENAME_EXCL`` / ``RENAME_SWAP`` (macOS 10.12+). Where they are missing (EINVAL, ENOSYS, ENOTSUP) a
no-replace falls back to ``os.link`` + ``os.unlink`` (files) or a check then ``os.rename``, and a swap
raises ``SWAP_UNSUPPORTED`` for ``transaction`` to move the old output aside under its journal.
The fallbacks' race windows: docs/design/outputs.md.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import platform
import sys

_AT_FDCWD = -100
_RENAME_NOREPLACE, _RENAME_EXCHANGE = 1, 2  # linux/fs.h
_RENAME_SWAP, _RENAME_EXCL = 0x2, 0x4  # macOS stdio.h
_SYS_RENAMEAT2 = {"x86_64": 316, "aarch64": 276, "arm64": 276, "ppc64le": 357, "s390x": 347, "riscv64": 276}
_UNSUPPORTED = {errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, getattr(errno, "EOPNOTSUPP", errno.ENOTSUP)}


class SwapUnsupported(OSError):
    """The platform or file system cannot swap two paths atomically."""


def _load_rename2():
    """A callable ``(src: bytes, dst: bytes, flag: str) -> int`` (0 or -1 with errno set), or None."""
    libc_name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(libc_name if sys.platform == "darwin" else None, use_errno=True)
    except OSError:
        return None
    if sys.platform.startswith("linux"):
        flags = {"noreplace": _RENAME_NOREPLACE, "exchange": _RENAME_EXCHANGE}
        fn = getattr(libc, "renameat2", None)  # glibc 2.28+
        if fn is not None:
            fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
            return lambda a, b, flag: fn(_AT_FDCWD, a, _AT_FDCWD, b, flags[flag])
        nr = _SYS_RENAMEAT2.get(platform.machine())
        if nr is None:
            return None
        sc = libc.syscall
        return lambda a, b, flag: sc(ctypes.c_long(nr), ctypes.c_int(_AT_FDCWD), ctypes.c_char_p(a),
                                     ctypes.c_int(_AT_FDCWD), ctypes.c_char_p(b), ctypes.c_uint(flags[flag]))
    if sys.platform == "darwin":
        flags = {"noreplace": _RENAME_EXCL, "exchange": _RENAME_SWAP}
        fn = getattr(libc, "renamex_np", None)
        if fn is None:
            return None
        fn.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_uint]
        return lambda a, b, flag: fn(a, b, flags[flag])
    return None


_rename2 = _load_rename2()


def _call(src, dst, flag: str) -> bool:
    """Run the native call; True if done, False if unsupported; raises OSError for real failures."""
    if _rename2 is None:
        return False
    if _rename2(os.fsencode(src), os.fsencode(dst), flag) == 0:
        return True
    err = ctypes.get_errno()
    if err in _UNSUPPORTED:
        return False
    raise OSError(err, os.strerror(err), str(src), None, str(dst))


def rename_noreplace(src, dst) -> None:
    """Rename ``src`` to ``dst``; raise FileExistsError (and change nothing) if ``dst`` exists.

    Args:
        src (str | Path): a file or folder. dst (str | Path): a path in the same file system.
    """
    if _call(src, dst, "noreplace"):
        return
    if os.path.isdir(src) and not os.path.islink(src):
        if os.path.lexists(dst):
            raise FileExistsError(errno.EEXIST, "File exists", str(dst))
        try:
            os.rename(src, dst)
        except OSError as e:
            if e.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR, errno.EISDIR):
                raise FileExistsError(errno.EEXIST, "File exists", str(dst)) from None
            raise
        return
    try:
        os.link(src, dst, follow_symlinks=False)
    except FileExistsError:
        raise
    except OSError as e:
        if e.errno not in _UNSUPPORTED | {errno.EPERM, errno.EXDEV, errno.EMLINK}:
            raise
        if os.path.lexists(dst):
            raise FileExistsError(errno.EEXIST, "File exists", str(dst)) from None
        os.rename(src, dst)
        return
    os.unlink(src)


def exchange(a, b) -> None:
    """Swap the paths ``a`` and ``b`` (files or folders) in one atomic step; both must exist.

    Raises:
        SwapUnsupported: the platform or file system cannot; the caller falls back.
    """
    if not _call(a, b, "exchange"):
        raise SwapUnsupported(errno.ENOTSUP, "atomic exchange is not supported here", str(a), None, str(b))


def fsync_path(path, *, directory: bool = False) -> None:
    """Flush ``path``'s data (or a folder's entries) to disk. File systems that cannot sync a folder
    (EINVAL, ENOTSUP) are skipped: they give no stronger guarantee to ask for."""
    flags = os.O_RDONLY | (getattr(os, "O_DIRECTORY", 0) if directory else 0)
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    except OSError as e:
        if e.errno not in _UNSUPPORTED | {errno.EBADF}:
            raise
    finally:
        os.close(fd)


def fsync_tree(root) -> None:
    """``fsync`` every file and folder under ``root`` (a folder or a file), folders after their contents."""
    if not os.path.isdir(root) or os.path.islink(root):
        fsync_path(root)
        return
    for folder, _dirs, files in os.walk(root, topdown=False):
        for name in files:
            p = os.path.join(folder, name)
            if not os.path.islink(p):
                fsync_path(p)
        fsync_path(folder, directory=True)
