"""outputs/transaction: staged outputs committed all or none, under failures, interrupts, full disks and races."""

from __future__ import annotations

import errno
import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest
from staged_outputs import (
    FILES,
    PNG_BYTES,
    child,
    commit_folders,
    crash_at,
    hidden,
    leftover_of,
    one_line,
    refuse_swap,
    tag_of,
    user_takes_over,
    write_output,
)

from vecmerge.errors import OutputError
from vecmerge.outputs import recovery as safe_recover
from vecmerge.outputs import rename as safe_rename
from vecmerge.outputs import transaction as safe_write
from vecmerge.outputs.policy import PNG, OutputPolicy
from vecmerge.outputs.transaction import OutputTransaction, discard_folder, recover, write_file

pytestmark = pytest.mark.skipif(not hasattr(os, "fork") or sys.platform == "win32", reason="POSIX semantics")


# ------------------------------------------------------------------------------------------- commits
def test_concurrent_commit_in_process_the_second_is_refused(tmp_path):
    """Both runs checked --out before either wrote it; the later commit must not replace the first."""
    policy = OutputPolicy()
    with pytest.raises(OutputError) as err:
        with OutputTransaction(policy) as slow:
            write_output(slow.folder(tmp_path / "out"), "slow")
            commit_folders([tmp_path / "out"], "fast")
            slow.commit()
    one_line(err, "appeared while vecmerge was writing", "pass --force")
    assert tag_of(tmp_path / "out") == "fast" and hidden(tmp_path) == []


def test_two_processes_commit_to_one_out_exactly_one_wins(tmp_path):
    parent = tmp_path / "runs"
    go = tmp_path / "go"
    procs = [child(tmp_path, {"targets": [str(parent / "out")], "tag": tag, "force": False, "go": str(go)})
             for tag in ("p1", "p2")]
    for p in procs:
        assert p.stdout.readline().strip() == "READY", p.communicate()[1]
    go.write_text("")
    outs = [(p.returncode, out) for p in procs for out, _ in [p.communicate(timeout=30)]]
    codes = sorted(rc for rc, _ in outs)
    assert codes == [0, 2], outs
    winner = "p1" if outs[0][0] == 0 else "p2"
    loser_out = outs[1][1] if winner == "p1" else outs[0][1]
    assert "appeared while vecmerge was writing" in loser_out
    assert tag_of(parent / "out") == winner and hidden(parent) == []


@pytest.mark.parametrize("exc", [KeyboardInterrupt(), OSError(errno.EIO, "Input/output error")])
@pytest.mark.parametrize("after_swap", [False, True])
def test_failure_injected_at_the_swap_keeps_a_complete_output(tmp_path, monkeypatch, exc, after_swap):
    """The worst moment of a forced replacement: the exchange itself (before or after it happened)."""
    commit_folders([tmp_path / "out"], "old")

    def failing_exchange(a, b):
        if after_swap:
            safe_rename.exchange(a, b)
        raise exc

    monkeypatch.setattr(safe_write, "exchange", failing_exchange)
    with pytest.raises(OutputError if isinstance(exc, OSError) else KeyboardInterrupt):
        commit_folders([tmp_path / "out"], "new", force=True)
    assert tag_of(tmp_path / "out") == "old" and hidden(tmp_path) == []


def test_interrupt_while_the_old_output_is_aside_restores_it(tmp_path, monkeypatch):
    """Without an atomic swap the final path is empty for a moment; an interrupt there is undone."""
    commit_folders([tmp_path / "out"], "old")
    monkeypatch.setattr(safe_write, "exchange", refuse_swap)
    monkeypatch.setattr(safe_recover, "exchange", refuse_swap)

    def at(step):
        if step == "aside":
            assert tag_of(tmp_path / "out") is None
            raise KeyboardInterrupt

    monkeypatch.setattr(safe_write, "_checkpoint", at)
    with pytest.raises(KeyboardInterrupt):
        commit_folders([tmp_path / "out"], "new", force=True)
    assert tag_of(tmp_path / "out") == "old" and hidden(tmp_path) == []
    monkeypatch.setattr(safe_write, "_checkpoint", lambda step: None)
    commit_folders([tmp_path / "out"], "new", force=True)  # and the fallback does replace
    assert tag_of(tmp_path / "out") == "new" and hidden(tmp_path) == []


def test_with_a_swap_the_final_path_is_complete_at_every_step(tmp_path, monkeypatch):
    commit_folders([tmp_path / "out"], "old")
    seen = []
    monkeypatch.setattr(safe_write, "_checkpoint", lambda step: seen.append((step, tag_of(tmp_path / "out"))))
    commit_folders([tmp_path / "out"], "new", force=True)
    assert [s for s, _ in seen] == ["staged", "built", "journal", "moved out", "done"]
    assert [t for _, t in seen] == ["old", "old", "old", "new", "new"]
    assert hidden(tmp_path) == []


def test_sigint_during_the_commit_is_held_until_it_is_decided(tmp_path, monkeypatch):
    commit_folders([tmp_path / "out"], "old")

    def at(step):
        if step == "journal":
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)  # delivered now, were it not held

    monkeypatch.setattr(safe_write, "_checkpoint", at)
    # Python's own SIGINT handler, as in a terminal (a job started in the background inherits SIGINT ignored)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            commit_folders([tmp_path / "out"], "new", force=True)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert tag_of(tmp_path / "out") == "new" and hidden(tmp_path) == []


# ----------------------------------------------------------------------------- ENOSPC / all or nothing
def test_enospc_while_building_the_second_dose_leaves_nothing(tmp_path, monkeypatch):
    commit_folders([tmp_path / "out-x0.5"], "old")
    real = Path.write_bytes

    def full(self, data):
        if self.parent.parent.name.startswith(".out-x1.tmp-"):  # a file of the second dose's build
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, data)

    monkeypatch.setattr(Path, "write_bytes", full)
    with pytest.raises(OutputError) as err:
        commit_folders([tmp_path / "out-x0.5", tmp_path / "out-x1"], "new", force=True)
    one_line(err, "--out", "out-x1: cannot write it (No space left on device); nothing was written")
    assert tag_of(tmp_path / "out-x0.5") == "old" and tag_of(tmp_path / "out-x1") is None
    assert hidden(tmp_path) == []


@pytest.mark.parametrize("where", ["rename_noreplace", "exchange", "write_json"])
def test_enospc_while_committing_the_second_dose_restores_the_first(tmp_path, monkeypatch, where):
    """out-x0.5 replaces an old output (a swap), out-x1 is new (a rename). The disk fills at the second
    member's move (rename_noreplace: x0.5 first; exchange: x1 first) or when the journal says done."""
    x05, x1 = tmp_path / "out-x0.5", tmp_path / "out-x1"
    commit_folders([x05], "old")
    real = getattr(safe_write, where)
    calls = []

    def full(*args):
        calls.append(args)
        if where != "write_json" or len(calls) == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(*args)

    monkeypatch.setattr(safe_write, where, full)
    with pytest.raises(OutputError) as err:
        commit_folders([x1, x05] if where == "exchange" else [x05, x1], "new", force=True)
    one_line(err, "No space left on device", "nothing was written")
    assert calls and tag_of(x05) == "old" and tag_of(x1) is None
    assert hidden(tmp_path) == []


def test_a_ladder_commits_all_outputs(tmp_path):
    commit_folders([tmp_path / "out-x1"], "old")
    names = ["out-x0.5", "out-x1", "out-x2"]
    assert commit_folders([tmp_path / n for n in names], "new", force=True) == [tmp_path / n for n in names]
    assert [tag_of(tmp_path / n) for n in names] == ["new"] * 3 and hidden(tmp_path) == []
    with pytest.raises(OutputError) as err:
        commit_folders([tmp_path / "a", tmp_path / "a"], "new")
    one_line(err, "given twice")


def test_discard_folder_removes_only_what_policy_allows(tmp_path):
    commit_folders([tmp_path / "demo"], "old")
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "n.txt").write_text("x")
    discard_folder(tmp_path / "demo", policy=OutputPolicy(force=True))
    assert not (tmp_path / "demo").exists() and hidden(tmp_path) == []
    with pytest.raises(OutputError):
        discard_folder(tmp_path / "notes", policy=OutputPolicy(force=True))
    assert (tmp_path / "notes" / "n.txt").read_text() == "x"


@pytest.mark.parametrize("fail_at", [None, "aside"])
def test_file_replacement_without_a_swap_never_leaves_the_path_empty(tmp_path, monkeypatch, fail_at):
    """The file fallback hard-links the old file aside, then os.replace: the path always holds a PNG."""
    policy = OutputPolicy(force=True)
    write_file(tmp_path / "p.png", PNG_BYTES + b"old", policy=policy, kind=PNG, flag="--plot")
    monkeypatch.setattr(safe_write, "exchange", refuse_swap)
    monkeypatch.setattr(safe_recover, "exchange", refuse_swap)

    def at(step):
        assert (tmp_path / "p.png").read_bytes().startswith(PNG_BYTES)
        if step == fail_at:
            raise KeyboardInterrupt

    monkeypatch.setattr(safe_write, "_checkpoint", at)
    if fail_at:
        with pytest.raises(KeyboardInterrupt):
            write_file(tmp_path / "p.png", PNG_BYTES + b"new", policy=policy, kind=PNG, flag="--plot")
    else:
        write_file(tmp_path / "p.png", PNG_BYTES + b"new", policy=policy, kind=PNG, flag="--plot")
    assert (tmp_path / "p.png").read_bytes() == PNG_BYTES + (b"old" if fail_at else b"new")
    assert hidden(tmp_path) == []


@pytest.mark.parametrize("no_swap", [False, True])
@pytest.mark.parametrize("swap", ["user-folder", "user-file-added"])
def test_a_target_changed_between_the_check_and_the_swap_is_put_back(tmp_path, monkeypatch, swap, no_swap):
    """--force replaces only what the check allowed: if, by the swap, the old output was replaced by the user's
    folder (or got a file the user added), that folder goes back untouched and the commit fails. The same without
    an atomic swap, where the old output is moved aside first (before the fix the user's folder was deleted)."""
    commit_folders([tmp_path / "out"], "old")
    if no_swap:
        monkeypatch.setattr(safe_write, "exchange", refuse_swap)
        monkeypatch.setattr(safe_recover, "exchange", refuse_swap)

    def meanwhile(step):
        if step == "journal":
            user_takes_over(tmp_path, swap)

    monkeypatch.setattr(safe_write, "_checkpoint", meanwhile)
    with pytest.raises(OutputError) as err:
        with OutputTransaction(OutputPolicy(force=True)) as txn:
            write_output(txn.folder(tmp_path / "out", expected_entries=[*FILES, "vecmerge.json"]), "new")
            txn.commit()
    one_line(err, "--out", "changed while vecmerge was writing; it was left as is")
    mine = "notes.txt" if swap == "user-folder" else "my-eval.txt"
    assert (tmp_path / "out" / mine).read_text() == "mine"
    assert [h for h in hidden(tmp_path) if ".tmp-" in h] == []


@pytest.mark.parametrize("replace", ["swap", "no-swap", "no-swap-no-hard-link"])
@pytest.mark.parametrize("change", ["text", "symlink"])
def test_a_file_target_changed_between_the_check_and_the_swap_is_put_back(tmp_path, monkeypatch, change, replace):
    """The same for a file (--plot): a PNG replaced, after the check, by another kind of file or by a symbolic link
    to the user's own PNG is left as it is (the link still a link, its file untouched), with an atomic swap, with
    the fallback that hard-links the old file aside, and with the one that renames it aside."""
    policy = OutputPolicy(force=True)
    write_file(tmp_path / "p.png", PNG_BYTES + b"old", policy=policy, kind=PNG, flag="--plot")
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "photo.png").write_bytes(PNG_BYTES + b"mine")
    if replace != "swap":
        monkeypatch.setattr(safe_write, "exchange", refuse_swap)
        monkeypatch.setattr(safe_recover, "exchange", refuse_swap)
    if replace == "no-swap-no-hard-link":
        def no_link(*args, **kwargs):
            raise OSError(errno.EPERM, "Operation not permitted")

        monkeypatch.setattr(safe_write.os, "link", no_link)

    def meanwhile(step):
        if step == "journal":
            (tmp_path / "p.png").unlink()
            if change == "text":
                (tmp_path / "p.png").write_bytes(b"my text, not an image")
            else:
                os.symlink(tmp_path / "mine" / "photo.png", tmp_path / "p.png")

    monkeypatch.setattr(safe_write, "_checkpoint", meanwhile)
    with pytest.raises(OutputError) as err:
        write_file(tmp_path / "p.png", PNG_BYTES + b"new", policy=policy, kind=PNG, flag="--plot")
    one_line(err, "--plot", "changed while vecmerge was writing")
    if change == "text":
        assert (tmp_path / "p.png").read_bytes() == b"my text, not an image"
    else:
        assert os.readlink(tmp_path / "p.png") == str(tmp_path / "mine" / "photo.png")
    assert (tmp_path / "mine" / "photo.png").read_bytes() == PNG_BYTES + b"mine" and hidden(tmp_path) == []


def test_discard_folder_is_recoverable_at_every_step_and_cleans_its_folder_first(tmp_path, monkeypatch):
    """discard_folder first recovers the leftovers beside its target (not in the working directory), names --out in
    its refusals, and a crash mid-discard leaves a marked wrapper beside the target that the next run removes."""
    parent = tmp_path / "runs"
    commit_folders([parent / "demo"], "old")
    crash_at("built", lambda: commit_folders([parent / "other"], "new"))
    monkeypatch.chdir(tmp_path)
    discard_folder(parent / "demo", policy=OutputPolicy(force=True))
    assert not (parent / "demo").exists() and hidden(parent) == []
    (parent / "notes").mkdir()
    (parent / "notes" / "n.txt").write_text("x")
    with pytest.raises(OutputError) as err:
        discard_folder(parent / "notes", policy=OutputPolicy(force=True))
    one_line(err, f"--out {parent / 'notes'}: exists and holds no vecmerge.json")
    with pytest.raises(OutputError) as err:
        discard_folder(parent / "notes", policy=OutputPolicy(force=True), flag="--demo-out")
    one_line(err, f"--demo-out {parent / 'notes'}: exists and holds no vecmerge.json", "choose another --demo-out")
    assert (parent / "notes" / "n.txt").read_text() == "x"
    commit_folders([parent / "demo"], "old")
    crash_at("discarded", lambda: discard_folder(parent / "demo", policy=OutputPolicy(force=True)))
    wrapper = leftover_of(parent)
    assert wrapper.name.startswith(".demo.tmp-") and not (parent / "demo").exists()
    marker = json.loads((wrapper / ".vecmerge-partial").read_text())  # what a person finding the folder reads
    assert (marker["tool"], marker["target"], marker["journal"]) == ("vecmerge", "demo", str(wrapper / "journal.json"))
    assert "an old vecmerge output being deleted" in marker["what"]
    assert recover(parent) == [f"removed the unfinished output {wrapper}"] and hidden(parent) == []


def test_a_transaction_that_was_aborted_says_so():
    txn = OutputTransaction(OutputPolicy())
    txn.abort()
    with pytest.raises(OutputError, match="these outputs were already aborted"):
        txn.commit()


@pytest.mark.parametrize("change", ["user-folder", "user-file-added"])
def test_a_target_changed_after_staging_is_refused_at_the_commit_with_the_reason(tmp_path, monkeypatch, change):
    """The commit checks every target again under --force: an old output that became the user's folder, or got a
    file the user added, after it was staged is refused with the check's own line (the flag, the path, the file
    vecmerge did not write) and left exactly as it is; nothing hidden stays."""
    commit_folders([tmp_path / "out"], "old")

    def meanwhile(step):
        if step == "built":
            user_takes_over(tmp_path, change)

    monkeypatch.setattr(safe_write, "_checkpoint", meanwhile)
    with pytest.raises(OutputError) as err:
        with OutputTransaction(OutputPolicy(force=True)) as txn:
            write_output(txn.folder(tmp_path / "out", flag="--merged", expected_entries=[*FILES, "vecmerge.json"]),
                         "new")
            txn.commit()
    why = "holds no vecmerge.json" if change == "user-folder" else "holds files vecmerge did not write (my-eval.txt)"
    one_line(err, f"--merged {tmp_path / 'out'}: exists and {why}", "choose another --merged")
    mine = "notes.txt" if change == "user-folder" else "my-eval.txt"
    assert (tmp_path / "out" / mine).read_text() == "mine" and hidden(tmp_path) == []


def test_a_failed_restore_keeps_the_old_output_for_the_next_run(tmp_path, monkeypatch):
    """A second fault: the commit fails after the swap and putting the old output back fails too. The one line says
    both, where the old output is kept and that the next run restores it; the next run writing there does."""
    parent = tmp_path / "runs"
    commit_folders([parent / "out"], "old")

    def at(step):
        if step == "moved out":
            raise OSError(errno.EIO, "Input/output error")

    def broken_undo(*args):
        raise OSError(errno.EIO, "cannot restore")

    monkeypatch.setattr(safe_write, "_checkpoint", at)
    monkeypatch.setattr(safe_write, "undo", broken_undo)
    txn = OutputTransaction(OutputPolicy(force=True))
    write_output(txn.folder(parent / "out"), "new")
    with pytest.raises(OutputError) as err:
        txn.commit()
    with pytest.raises(OutputError, match="these outputs were already failed"):  # and it stays failed
        txn.commit()
    wrapper = leftover_of(parent)
    one_line(err, f"--out {parent / 'out'}: writing failed", "restoring the old output failed too",
             f"it is kept in {wrapper}", f"the next vecmerge run writing to {parent} restores it")
    assert tag_of(wrapper / "new") == "old"
    monkeypatch.undo()
    commit_folders([parent / "other"], "next")
    assert tag_of(parent / "out") == "old" and tag_of(parent / "other") == "next" and hidden(parent) == []


def test_commit_on_its_own_is_all_or_nothing_and_says_what_it_did(tmp_path, monkeypatch):
    """commit() outside a with block keeps the promise by itself: the disk filling while a ladder is committed is one
    OutputError line (the first output, the system's words, "nothing was written"), the old output stays and no
    staged build is left behind; a committed set says so when it is used again."""
    x05, x1 = tmp_path / "out-x0.5", tmp_path / "out-x1"
    commit_folders([x05], "old")

    def full(*args):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(safe_write, "rename_noreplace", full)  # x0.5 is swapped in, x1 (new) cannot be moved in
    txn = OutputTransaction(OutputPolicy(force=True))
    for target in (x05, x1):
        write_output(txn.folder(target), "new")
    with pytest.raises(OutputError) as err:
        txn.commit()
    one_line(err, f"--out {x05}: cannot write it (No space left on device); nothing was written")
    assert tag_of(x05) == "old" and tag_of(x1) is None and hidden(tmp_path) == []
    monkeypatch.undo()
    txn = OutputTransaction(OutputPolicy(force=True))
    write_output(txn.folder(x1), "new")
    assert txn.commit() == [x1] and tag_of(x1) == "new"
    with pytest.raises(OutputError) as err:
        txn.folder(tmp_path / "more")
    one_line(err, f"--out {tmp_path / 'more'}: this set of outputs was already committed")
    with pytest.raises(OutputError, match="^these outputs were already committed$"):
        txn.commit()
    assert hidden(tmp_path) == []


def test_staging_refuses_an_output_with_files_the_user_added_before_building(tmp_path):
    """OutputTransaction.folder applies the whole check at once: an old output holding a file vecmerge did not write
    is refused under --force when the folder is asked for (before anything is built), in the flag's own words, and
    stays as it is."""
    commit_folders([tmp_path / "out"], "old")
    (tmp_path / "out" / "my-eval.txt").write_text("results")
    with pytest.raises(OutputError) as err:
        with OutputTransaction(OutputPolicy(force=True)) as txn:
            txn.folder(tmp_path / "out", flag="--merged", expected_entries=[*FILES, "vecmerge.json"])
            pytest.fail("staged an output the check must refuse")
    one_line(err, f"--merged {tmp_path / 'out'}: exists and holds files vecmerge did not write (my-eval.txt)",
             "choose another --merged")
    assert (tmp_path / "out" / "my-eval.txt").read_text() == "results" and hidden(tmp_path) == []


def test_staging_creates_missing_parents_and_reports_every_recovery(tmp_path):
    """An output whose parent folders do not exist yet gets them; a ladder whose outputs lie in two folders cleans
    both before staging and reports every leftover it removed (one line each), the first folder's too."""
    first, second = tmp_path / "runs", tmp_path / "deep" / "er"
    first.mkdir()
    crash_at("built", lambda: commit_folders([first / "dead"], "dead"))
    leftover = leftover_of(first)
    with OutputTransaction(OutputPolicy()) as txn:
        write_output(txn.folder(first / "out"), "new")
        write_output(txn.folder(second / "out"), "new")
        txn.commit()
    assert txn.recovered == [f"removed the unfinished output {leftover}"]
    assert tag_of(first / "out") == "new" and tag_of(second / "out") == "new"
    assert hidden(first) == [] and hidden(second) == []


def test_an_output_that_appears_just_before_the_move_is_left_to_its_writer(tmp_path, monkeypatch):
    """Another run's output appearing after the commit's last check, just before the move (no --force): the move
    refuses to replace it (rename without replace), the commit fails with the one line naming it, and the other
    run's output stays complete; nothing hidden is left."""
    def meanwhile(step):
        if step == "journal":
            (tmp_path / "out").mkdir()
            write_output(tmp_path / "out", "other")

    monkeypatch.setattr(safe_write, "_checkpoint", meanwhile)
    with pytest.raises(OutputError) as err:
        commit_folders([tmp_path / "out"], "mine")
    one_line(err, f"--out {tmp_path / 'out'}: appeared while vecmerge was writing", "pass --force")
    assert tag_of(tmp_path / "out") == "other" and hidden(tmp_path) == []


def test_a_write_failure_names_the_output_being_built(tmp_path):
    """An OSError while building the third of three outputs names the third, and nothing is left."""
    with pytest.raises(OutputError, match=r"--out .*c: cannot write it \(No space left on device\)"):
        with OutputTransaction(OutputPolicy()) as txn:
            for name in "abc":
                folder = txn.folder(tmp_path / name)
                if name == "c":
                    raise OSError(errno.ENOSPC, "No space left on device")
                write_output(folder, "t")
    assert hidden(tmp_path) == [] and not any((tmp_path / n).exists() for n in "abc")
