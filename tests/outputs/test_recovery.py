"""outputs/recovery: leftovers of killed runs are recognised, restored or removed, and only vecmerge's own."""

from __future__ import annotations

import json
import os
import sys

import pytest
from staged_outputs import (
    PNG_BYTES,
    commit_folders,
    crash_at,
    hidden,
    journal_of,
    kill_at,
    leftover_of,
    refuse_swap,
    tag_of,
    write_output,
)

from vecmerge.outputs import recovery as safe_recover
from vecmerge.outputs import transaction as safe_write
from vecmerge.outputs.policy import PNG, OutputPolicy
from vecmerge.outputs.transaction import OutputTransaction, discard_folder, recover, write_file

pytestmark = pytest.mark.skipif(not hasattr(os, "fork") or sys.platform == "win32", reason="POSIX semantics")


@pytest.mark.parametrize("step, no_swap, during, after", [
    ("half-built", False, "old", "old"),
    ("built", False, "old", "old"),
    ("journal", False, "old", "old"),
    ("moved out", False, "new", "old"),    # swapped in, not yet decided: the old output comes back
    ("aside", True, None, "old"),          # no atomic swap: the old output is aside, the path empty
    ("moved out", True, "new", "old"),
    ("done", False, "new", "new"),         # decided: only the leftovers go
])
def test_sigkill_during_a_forced_replacement_then_the_next_run_repairs(tmp_path, step, no_swap, during, after):
    parent = tmp_path / "runs"
    commit_folders([parent / "out"], "old")
    kill_at(tmp_path, {"targets": [str(parent / "out")], "tag": "new", "force": True, "no_swap": no_swap}, step)
    assert tag_of(parent / "out") == during
    assert any(h.startswith(".out.tmp-") for h in hidden(parent))  # the dead run's leftover
    commit_folders([parent / "other"], "next")  # the next run writing into this folder repairs it
    assert tag_of(parent / "out") == after and tag_of(parent / "other") == "next"
    assert hidden(parent) == []


def test_sigkill_in_the_middle_of_a_dose_ladder_restores_every_old_output(tmp_path):
    parent = tmp_path / "runs"
    names = ["out-x0.5", "out-x1", "out-x2"]
    commit_folders([parent / n for n in names[:2]], "old")  # x2 is new in this run
    kill_at(tmp_path, {"targets": [str(parent / n) for n in names], "tag": "new", "force": True}, "moved out-x1")
    assert [tag_of(parent / n) for n in names] == ["new", "new", None]
    lines = recover(parent)
    assert sum("restored" in x for x in lines) == 2, lines
    assert [tag_of(parent / n) for n in names] == ["old", "old", None] and hidden(parent) == []


def test_sigkill_of_a_first_write_leaves_nothing_after_recovery(tmp_path):
    parent = tmp_path / "runs"
    parent.mkdir()
    kill_at(tmp_path, {"targets": [str(parent / "out")], "tag": "new", "force": False}, "half-built")
    assert tag_of(parent / "out") is None
    (leftover,) = hidden(parent)
    assert recover(parent) == [f"removed the unfinished output {parent / leftover}"]
    assert hidden(parent) == []


# ---------------------------------------------------------------------------------- recovery scope
def test_recover_touches_only_dead_marked_leftovers(tmp_path):
    (tmp_path / ".out.tmp-abcdefgh").mkdir()  # the name, but no marker: the user's
    (tmp_path / ".out.tmp-abcdefgh" / "data").write_text("mine")
    fake = tmp_path / ".out.tmp-ijklmnop"
    fake.mkdir()
    (fake / ".vecmerge-partial").write_text('{"tool": "other", "target": "out", "journal": "x"}')
    (tmp_path / ".out.old-12345678").mkdir()  # left by an older vecmerge: no marker
    with OutputTransaction(OutputPolicy()) as live:  # a live run's wrapper: locked
        write_output(live.folder(tmp_path / "live"), "live")
        assert recover(tmp_path) == []
        live.commit()
    assert hidden(tmp_path) == [".out.old-12345678", ".out.tmp-abcdefgh", ".out.tmp-ijklmnop"]
    assert (tmp_path / ".out.tmp-abcdefgh" / "data").read_text() == "mine"


def test_recover_keeps_a_leftover_whose_journal_is_not_trustworthy(tmp_path):
    """A swapped-out old output sits in the wrapper; with a damaged journal nothing may be deleted."""
    commit_folders([tmp_path / "out"], "old")
    kill_at(tmp_path, {"targets": [str(tmp_path / "out")], "tag": "new", "force": True}, "moved out")
    (leftover,) = hidden(tmp_path)
    (tmp_path / leftover / "journal.json").write_text('{"state": "committing", "members": "garbage"}')
    (line,) = recover(tmp_path)
    assert line.startswith(f"left {tmp_path / leftover} as is") and hidden(tmp_path) == [leftover]
    assert tag_of(tmp_path / leftover / "new") == "old" and tag_of(tmp_path / "out") == "new"


def test_recover_reports_what_it_restored_and_removes_each_wrapper_once_the_journal_last(tmp_path):
    """A ladder killed mid-commit: every member is restored (one line each), then each wrapper removed exactly
    once, the journal's wrapper (the first member's) last, so a crash during clean-up can still be read."""
    parent = tmp_path / "runs"
    names = ["out-x0.5", "out-x1"]
    commit_folders([parent / n for n in names], "old")
    crash_at("moved out-x1", lambda: commit_folders([parent / n for n in names], "new", force=True))
    wrappers = {n: next(parent / h for h in hidden(parent) if h.startswith(f".{n}.tmp-")) for n in names}
    assert (wrappers["out-x0.5"] / "journal.json").is_file()
    lines = recover(parent)
    assert lines == [f"restored {parent / 'out-x1'} (a commit of vecmerge was interrupted)",
                     f"restored {parent / 'out-x0.5'} (a commit of vecmerge was interrupted)",
                     f"removed the leftover {wrappers['out-x1']}", f"removed the leftover {wrappers['out-x0.5']}"]
    assert [tag_of(parent / n) for n in names] == ["old", "old"] and hidden(parent) == []


def test_recover_after_a_crash_while_the_old_output_was_aside(tmp_path, monkeypatch):
    """No atomic swap: the old output was moved aside and the path is empty; the next recovery puts it back and
    says so."""
    commit_folders([tmp_path / "out"], "old")
    monkeypatch.setattr(safe_write, "exchange", refuse_swap)
    monkeypatch.setattr(safe_recover, "exchange", refuse_swap)
    crash_at("aside", lambda: commit_folders([tmp_path / "out"], "new", force=True))
    assert tag_of(tmp_path / "out") is None
    wrapper = leftover_of(tmp_path)
    assert recover(tmp_path) == [f"restored {tmp_path / 'out'} (a commit of vecmerge was interrupted)",
                                 f"removed the leftover {wrapper}"]
    assert tag_of(tmp_path / "out") == "old" and hidden(tmp_path) == []


@pytest.mark.parametrize("damage", ["state", "parent", "name", "big", "other-file", "journal-dir"])
def test_recover_trusts_only_a_journal_vecmerge_wrote(tmp_path, damage):
    """A committing leftover whose journal is off in any one way is left exactly as it is (with the line saying
    so): a state other than committing/done, a member whose wrapper is not beside its target or not named after
    it, a journal over 1 MiB, a marker naming another file, a journal that is not a file."""
    parent = tmp_path / "runs"
    commit_folders([parent / "out"], "old")
    crash_at("moved out", lambda: commit_folders([parent / "out"], "new", force=True))
    wrapper = leftover_of(parent)
    plan = journal_of(wrapper)
    journal = wrapper / "journal.json"
    if damage == "state":
        plan["state"] = "paused"
    elif damage == "parent":
        plan["members"][0]["target"] = str(tmp_path / "out")
    elif damage == "name":
        plan["members"][0]["target"] = str(parent / "other")
    elif damage == "big":
        plan["pad"] = "x" * (3 << 19)  # 1.5 MiB: a valid journal, but larger than any vecmerge writes
    if damage in ("state", "parent", "name", "big"):
        journal.write_text(json.dumps(plan))
    elif damage == "other-file":
        marker = json.loads((wrapper / ".vecmerge-partial").read_text())
        (wrapper / "plan.json").write_text(journal.read_text())
        (wrapper / ".vecmerge-partial").write_text(json.dumps({**marker, "journal": str(wrapper / "plan.json")}))
        journal = wrapper / "plan.json"
    else:
        journal.unlink()
        journal.mkdir()
    assert recover(parent) == [f"left {wrapper} as is: its journal {journal} is not one vecmerge wrote; inspect it"]
    assert tag_of(parent / "out") == "new" and tag_of(wrapper / "new") == "old"


@pytest.mark.parametrize("damage", ["symlinked-marker", "big-marker"])
def test_recover_ignores_a_leftover_whose_marker_is_not_plainly_vecmerges(tmp_path, damage):
    """The marker must be a plain file of at most 64 KiB naming vecmerge; a symbolic link to a good marker, or a
    marker padded past 64 KiB, leaves the folder untouched (recover does nothing, says nothing)."""
    parent = tmp_path / "runs"
    parent.mkdir()
    crash_at("built", lambda: commit_folders([parent / "out"], "new"))
    wrapper = leftover_of(parent)
    marker = wrapper / ".vecmerge-partial"
    info = json.loads(marker.read_text())
    if damage == "symlinked-marker":
        (tmp_path / "elsewhere.json").write_text(json.dumps(info))
        marker.unlink()
        os.symlink(tmp_path / "elsewhere.json", marker)
    else:
        marker.write_text(json.dumps({**info, "pad": "x" * (100 << 10)}))
    assert recover(parent) == [] and wrapper.is_dir()


def test_recover_leaves_a_leftover_whose_owner_is_alive_and_closes_what_it_opened(tmp_path):
    """A marker another holder has locked is a live run's: left alone, without error. Recovering a dead one
    leaves no descriptor open."""
    import fcntl

    parent = tmp_path / "runs"
    parent.mkdir()
    crash_at("built", lambda: commit_folders([parent / "out"], "new"))
    wrapper = leftover_of(parent)
    fd = os.open(wrapper / ".vecmerge-partial", os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        assert recover(parent) == [] and wrapper.is_dir()
    finally:
        os.close(fd)
    before = sorted(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else None
    assert recover(parent) == [f"removed the unfinished output {wrapper}"] and hidden(parent) == []
    if before is not None:
        assert sorted(os.listdir("/proc/self/fd")) == before


def test_a_leftover_says_what_it_is_and_where_its_journal_is(tmp_path, monkeypatch):
    """A user who finds a hidden ``.NAME.tmp-*`` folder reads in its marker what it is; every member of one
    transaction points at the first member's journal (one journal decides a ladder); a written file has the
    usual permissions (0o644 less the umask), never an executable bit."""
    seen = {}

    def at(step):
        if step == "staged":
            for w in tmp_path.glob(".*.tmp-*"):
                seen[w.name.split(".tmp-")[0]] = (w, safe_recover.read_marker(w))
        if step == "discarded":
            (w,) = tmp_path.glob(".old.tmp-*")
            seen["discard"] = safe_recover.read_marker(w)

    monkeypatch.setattr(safe_write, "_checkpoint", at)
    commit_folders([tmp_path / "a", tmp_path / "b"], "new")
    (wa, ma), (_, mb) = seen[".a"], seen[".b"]
    for m, name in ((ma, "a"), (mb, "b")):
        assert m["tool"] == "vecmerge" and m["target"] == name
        assert m["what"] == ("an unfinished vecmerge output; the next vecmerge run writing here removes or "
                             "restores it")
    assert ma["journal"] == mb["journal"] == str(wa / safe_recover.JOURNAL)
    commit_folders([tmp_path / "old"], "x")
    discard_folder(tmp_path / "old", policy=OutputPolicy(force=True))
    assert seen["discard"]["what"] == "an old vecmerge output being deleted" and not (tmp_path / "old").exists()
    umask = os.umask(0o022)
    os.umask(umask)
    png = write_file(tmp_path / "p.png", PNG_BYTES, policy=OutputPolicy(), kind=PNG, flag="--plot")
    assert png.stat().st_mode & 0o777 == 0o644 & ~umask
