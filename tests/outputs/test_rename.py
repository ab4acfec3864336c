"""outputs/rename: renames that never replace by accident, and atomic swaps."""

from __future__ import annotations

import os
import sys

import pytest

from vecmerge.outputs import rename as safe_rename

pytestmark = pytest.mark.skipif(not hasattr(os, "fork") or sys.platform == "win32", reason="POSIX semantics")


# --------------------------------------------------------------------------------------- renames
def test_rename_noreplace_and_exchange(tmp_path, monkeypatch):
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_text("A")
    b.write_text("B")
    with pytest.raises(FileExistsError):
        safe_rename.rename_noreplace(a, b)
    assert (a.read_text(), b.read_text()) == ("A", "B")
    safe_rename.exchange(a, b)
    assert (a.read_text(), b.read_text()) == ("B", "A")
    monkeypatch.setattr(safe_rename, "_rename2", None)  # the portable fallbacks
    with pytest.raises(FileExistsError):
        safe_rename.rename_noreplace(a, b)
    with pytest.raises(safe_rename.SwapUnsupported):
        safe_rename.exchange(a, b)
    (tmp_path / "d1").mkdir()
    (tmp_path / "d2").mkdir()
    (tmp_path / "d2" / "x").write_text("x")
    with pytest.raises(FileExistsError):
        safe_rename.rename_noreplace(tmp_path / "d1", tmp_path / "d2")
    safe_rename.rename_noreplace(a, tmp_path / "c")
    assert (tmp_path / "c").read_text() == "B" and not a.exists()
