"""safe_policy / safe_write / safe_recover / safe_rename: nothing lost, nothing half-written.

An "output" in these tests is a folder with three data files and a ``vecmerge.json`` naming its tag;
:func:`tag_of` reads one back and fails on anything incomplete, so "the final path holds a complete old
or new output" is checked, not assumed. Crashes are real: a child process is stopped at a named step of
the write (the ``safe_write._checkpoint`` test hook) and killed with SIGKILL.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from vecmerge.errors import OutputError
from vecmerge.outputs import recovery as safe_recover
from vecmerge.outputs import rename as safe_rename
from vecmerge.outputs import transaction as safe_write
from vecmerge.outputs.policy import PNG, OutputPolicy, Protected
from vecmerge.outputs.transaction import OutputTransaction, discard_folder, recover, write_file

REPO = Path(__file__).resolve().parents[2]
FILES = ("a.bin", "b.bin", "c.bin")
PNG_BYTES = b"\x89PNG\r\n\x1a\n" + b"\0" * 32

pytestmark = pytest.mark.skipif(not hasattr(os, "fork") or sys.platform == "win32", reason="POSIX semantics")


def write_output(folder: Path, tag: str, halfway=lambda: None) -> None:
    """A complete output: three data files, then the manifest listing them."""
    for i, name in enumerate(FILES):
        (folder / name).write_bytes(f"{tag}:{name}\n".encode() * 2000)
        if i == 0:
            halfway()
    (folder / "vecmerge.json").write_text(json.dumps({"tool": "vecmerge", "tag": tag, "files": list(FILES)}))


def tag_of(folder: Path) -> str | None:
    """The tag of the complete output at ``folder``; None if absent; AssertionError if incomplete."""
    if not os.path.lexists(folder):
        return None
    assert sorted(os.listdir(folder)) == sorted([*FILES, "vecmerge.json"]), os.listdir(folder)
    tag = json.loads((folder / "vecmerge.json").read_text())["tag"]
    for name in FILES:
        assert (folder / name).read_bytes() == f"{tag}:{name}\n".encode() * 2000
    return tag


def hidden(parent: Path) -> list[str]:
    return sorted(n for n in os.listdir(parent) if n.startswith("."))


def commit_folders(targets, tag, *, force=False, protected=()) -> list[Path]:
    policy = OutputPolicy(protected=tuple(protected), force=force)
    with OutputTransaction(policy) as txn:
        for t in targets:
            write_output(txn.folder(t), tag)
        return txn.commit()


def user_takes_over(parent: Path, change: str) -> None:
    """The old output ``parent/out`` becomes the user's: another folder with their notes (``user-folder``),
    or gets a file of theirs (``user-file-added``)."""
    if change == "user-folder":
        os.rename(parent / "out", parent / "moved")
        (parent / "out").mkdir()
        (parent / "out" / "notes.txt").write_text("mine")
    else:
        (parent / "out" / "my-eval.txt").write_text("mine")


def one_line(err: pytest.ExceptionInfo, *needles: str) -> str:
    msg = str(err.value)
    assert "\n" not in msg and err.value.exit_code == 2, msg
    for n in needles:
        assert n in msg, msg
    return msg


# ------------------------------------------------------------------------------------------ refusals
@pytest.fixture
def ws(tmp_path, monkeypatch):
    """A workspace-like tree: inputs v28, v51 (named by the workspace), base, and the user's notes."""
    monkeypatch.chdir(tmp_path)
    for name in ("v28", "v51", "v54"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "adapter_config.json").write_text("{}")
        (tmp_path / name / "adapter_model.safetensors").write_bytes(b"weights")
    write_output(tmp_path / "v51", "earlier-vecmerge-output")  # a vecmerge output the workspace names
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "config.json").write_text("{}")
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("my notes")
    policy = OutputPolicy.for_command(inputs=["v28"], workspace_adapters={"v28": tmp_path / "v28",
                                      "v51": tmp_path / "v51", "v54": tmp_path / "v54"},
                                      base_model=tmp_path / "base", force=True)
    return tmp_path, policy


@pytest.mark.parametrize("out, needle", [
    ("v28", "is the input v28"),
    ("v28/sub", "lies inside the input v28"),
    ("notes/../v28", "is the input v28"),
    (".", "contains the input v28"),
    ("v51", "is the workspace adapter 'v51'"),
    ("v54/out", "lies inside the workspace adapter 'v54'"),
    ("base", "is the base model"),
])
def test_force_never_writes_a_protected_path(ws, out, needle):
    root, policy = ws
    before = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}
    with pytest.raises(OutputError) as err:
        commit_folders([out], "new", force=True, protected=policy.protected)
    one_line(err, f"--out {out}", needle, "choose another --out")
    assert {p: p.read_bytes() for p in root.rglob("*") if p.is_file()} == before
    assert hidden(root) == []


def test_a_symlink_to_an_input_is_the_input(ws):
    root, policy = ws
    os.symlink(root / "v28", root / "link")
    with pytest.raises(OutputError) as err:
        policy.check_folder("link")
    one_line(err, "is the input v28")
    os.symlink(root / "notes", root / "link2")  # not protected, but never written through
    with pytest.raises(OutputError) as err:
        policy.check_folder("link2")
    one_line(err, "is a symbolic link")


def test_force_never_replaces_the_users_folder(ws):
    root, policy = ws
    with pytest.raises(OutputError) as err:
        commit_folders(["notes"], "new", force=True, protected=policy.protected)
    one_line(err, "--out notes: exists and holds no vecmerge.json", "choose another --out or move it away")
    assert (root / "notes" / "todo.txt").read_text() == "my notes"
    (root / "fake").mkdir()
    (root / "fake" / "vecmerge.json").write_text('{"tool": "other"}')
    with pytest.raises(OutputError) as err:
        policy.check_folder("fake")
    one_line(err, "its vecmerge.json was not written by vecmerge")


def test_force_replaces_vecmerge_outputs_empty_folders_and_demo_folders(ws):
    root, policy = ws
    commit_folders(["out"], "old")
    (root / "empty").mkdir()
    (root / "demo").mkdir()
    (root / "demo" / ".vecmerge-demo").write_text("made by vecmerge demo")
    (root / "demo" / "train.log").write_text("x")
    for name in ("out", "empty", "demo"):
        commit_folders([name], "new", force=True, protected=policy.protected)
        assert tag_of(root / name) == "new"
    assert hidden(root) == []


@pytest.mark.parametrize("weights", ["model.safetensors", "model.safetensors.index.json", "pytorch_model.bin"])
def test_nothing_lands_inside_a_model_folder_no_workspace_names(ws, weights):
    """An adapter's declared base model (a local folder no workspace names) is never written into (stranger2)."""
    root, _ = ws
    (root / "llama").mkdir()
    (root / "llama" / "config.json").write_text("{}")
    (root / "llama" / weights).write_bytes(b"weights")
    before = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}
    for out in ("llama/merged", "llama/a/b"):
        with pytest.raises(OutputError) as err:
            commit_folders([out], "new")
        one_line(err, f"--out {out}", f"lies in a model folder (beside {weights} in", "choose another --out")
        with pytest.raises(OutputError) as err:
            write_file(f"{out}.png", PNG_BYTES, policy=OutputPolicy(), kind=PNG, flag="--plot")
        one_line(err, f"--plot {out}.png", "lies in a model folder")
    assert {p: p.read_bytes() for p in root.rglob("*") if p.is_file()} == before
    assert hidden(root / "llama") == []
    commit_folders(["base/sub"], "new")  # config.json alone is no model folder
    assert tag_of(root / "base" / "sub") == "new"


def test_without_force_an_existing_folder_is_refused(ws):
    root, _ = ws
    commit_folders(["out"], "old")
    with pytest.raises(OutputError) as err:
        commit_folders(["out"], "new")
    one_line(err, "--out out: already exists; pass --force to replace it, or choose another --out")
    assert tag_of(root / "out") == "old" and hidden(root) == []


def test_expected_entries_protect_files_the_user_added(ws):
    root, policy = ws
    commit_folders(["out"], "old")
    (root / "out" / "my-eval.txt").write_text("results")
    with pytest.raises(OutputError) as err:
        policy.check_folder("out", expected_entries=[*FILES, "vecmerge.json"])
    one_line(err, "holds files vecmerge did not write (my-eval.txt)")
    assert policy.check_folder("out") == Path("out")  # without the list, a vecmerge folder is replaceable


def test_plot_refusals(ws):
    root, policy = ws
    cases = [("v28/adapter_model.safetensors", "lies inside the input v28"),
             ("v28/adapter_config.json", "lies inside the input v28"),
             ("out/plot.png", None),  # filled below: an adapter folder that is not an input
             ("notes/todo.txt", "exists and is not a PNG image; refusing to replace it even with --force"),
             ("notes", "is a folder")]
    commit_folders(["out"], "x")
    cases[2] = ("out/plot.png", "lies in an adapter folder (beside vecmerge.json in")
    os.mkfifo(root / "fifo.png")
    cases.append(("fifo.png", "is not a regular file"))
    before = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}
    for path, needle in cases:
        with pytest.raises(OutputError) as err:
            write_file(path, PNG_BYTES, policy=policy, kind=PNG, flag="--plot")
        one_line(err, f"--plot {path}", needle)
    assert {p: p.read_bytes() for p in root.rglob("*") if p.is_file()} == before
    assert [h for d in (root, root / "notes", root / "out", root / "v28") for h in hidden(d)] == []


def test_plot_is_written_atomically_and_replaces_only_a_png(ws):
    root, policy = ws
    write_file("heat.png", PNG_BYTES, policy=policy, kind=PNG, flag="--plot")
    os.link(root / "heat.png", root / "kept.png")  # a hard link elsewhere keeps the old content
    write_file("heat.png", lambda f: f.write(PNG_BYTES + b"v2"), policy=policy, kind=PNG, flag="--plot")
    assert (root / "heat.png").read_bytes() == PNG_BYTES + b"v2"
    assert (root / "kept.png").read_bytes() == PNG_BYTES
    strict = OutputPolicy(protected=policy.protected, force=False)
    with pytest.raises(OutputError) as err:
        write_file("heat.png", PNG_BYTES, policy=strict, kind=PNG, flag="--plot")
    one_line(err, "already exists; pass --force")
    assert hidden(root) == []


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


CHILD = r'''
import json, os, sys, time
sys.path.insert(0, os.environ["TEST_DIR"])
from test_transaction import write_output
from vecmerge.outputs import recovery as safe_recover, transaction as safe_write
from vecmerge.errors import OutputError
from vecmerge.outputs.policy import OutputPolicy
from vecmerge.outputs.rename import SwapUnsupported

job = json.loads(sys.argv[1])

def stop(step):
    if step == job.get("stop_at"):
        print("AT", step, flush=True)
        time.sleep(60)

safe_write._checkpoint = stop
if job.get("no_swap"):
    def nope(a, b):
        raise SwapUnsupported(95, "no swap here", str(a))
    safe_write.exchange = safe_recover.exchange = nope
try:
    with safe_write.OutputTransaction(OutputPolicy(force=job["force"])) as txn:
        for t in job["targets"]:
            write_output(txn.folder(t), job["tag"], halfway=lambda: stop("half-built"))
        if job.get("go"):
            print("READY", flush=True)
            while not os.path.exists(job["go"]):
                time.sleep(0.005)
        txn.commit()
except OutputError as e:
    print("ERROR", e, flush=True)
    sys.exit(2)
print("OK", flush=True)
'''


def child(tmp_path: Path, job: dict) -> subprocess.Popen:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    env = dict(os.environ, TEST_DIR=str(Path(__file__).parent), PYTHONPATH=str(REPO))
    return subprocess.Popen([sys.executable, str(script), json.dumps(job)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


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


def kill_at(tmp_path: Path, job: dict, step: str) -> None:
    p = child(tmp_path, dict(job, stop_at=step))
    line = p.stdout.readline().strip()
    if line != f"AT {step}":
        p.kill()
        pytest.fail(f"child did not reach {step}: {line!r} {p.communicate()[1]}")
    p.send_signal(signal.SIGKILL)
    p.communicate(timeout=30)  # reaps it and closes the pipes
    assert p.returncode == -signal.SIGKILL


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
    monkeypatch.setattr(safe_write, "exchange", _no_swap)
    monkeypatch.setattr(safe_recover, "exchange", _no_swap)

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


def _no_swap(a, b):
    raise safe_rename.SwapUnsupported(errno.ENOTSUP, "no swap", str(a))


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


def test_discard_folder_removes_only_what_policy_allows(tmp_path):
    commit_folders([tmp_path / "demo"], "old")
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "n.txt").write_text("x")
    discard_folder(tmp_path / "demo", policy=OutputPolicy(force=True))
    assert not (tmp_path / "demo").exists() and hidden(tmp_path) == []
    with pytest.raises(OutputError):
        discard_folder(tmp_path / "notes", policy=OutputPolicy(force=True))
    assert (tmp_path / "notes" / "n.txt").read_text() == "x"


def test_protected_compares_device_and_inode(tmp_path):
    """A bind-mount-like alias (here: a hard-to-spot second path via a symlinked parent) is caught."""
    (tmp_path / "real" / "v28").mkdir(parents=True)
    os.symlink(tmp_path / "real", tmp_path / "alias")
    policy = OutputPolicy(protected=(Protected(tmp_path / "alias" / "v28", "the input v28"),))
    with pytest.raises(OutputError) as err:
        policy.check_folder(tmp_path / "real" / "v28" / "x")
    one_line(err, "lies inside the input v28")


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


@pytest.mark.parametrize("fail_at", [None, "aside"])
def test_file_replacement_without_a_swap_never_leaves_the_path_empty(tmp_path, monkeypatch, fail_at):
    """The file fallback hard-links the old file aside, then os.replace: the path always holds a PNG."""
    policy = OutputPolicy(force=True)
    write_file(tmp_path / "p.png", PNG_BYTES + b"old", policy=policy, kind=PNG, flag="--plot")
    monkeypatch.setattr(safe_write, "exchange", _no_swap)
    monkeypatch.setattr(safe_recover, "exchange", _no_swap)

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


def test_recover_keeps_a_leftover_whose_journal_is_not_trustworthy(tmp_path):
    """A swapped-out old output sits in the wrapper; with a damaged journal nothing may be deleted."""
    commit_folders([tmp_path / "out"], "old")
    kill_at(tmp_path, {"targets": [str(tmp_path / "out")], "tag": "new", "force": True}, "moved out")
    (leftover,) = hidden(tmp_path)
    (tmp_path / leftover / "journal.json").write_text('{"state": "committing", "members": "garbage"}')
    (line,) = recover(tmp_path)
    assert line.startswith(f"left {tmp_path / leftover} as is") and hidden(tmp_path) == [leftover]
    assert tag_of(tmp_path / leftover / "new") == "old" and tag_of(tmp_path / "out") == "new"


# ------------------------------------------------------------------------ crashes in this process (fork)
def crash_at(step: str, work) -> None:
    """Run ``work()`` in a forked child that dies (``os._exit``, no clean-up at all) at checkpoint ``step``."""
    pid = os.fork()
    if pid == 0:  # the child: no pytest, no exception handling, no atexit
        def die(at):
            if at == step:
                os._exit(0)

        safe_write._checkpoint = die
        try:
            work()
        finally:
            os._exit(3)  # it never reached the step
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, f"the child did not reach {step}"


def leftover_of(parent: Path) -> Path:
    (name,) = [h for h in hidden(parent) if ".tmp-" in h]
    return parent / name


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
    monkeypatch.setattr(safe_write, "exchange", _no_swap)
    monkeypatch.setattr(safe_recover, "exchange", _no_swap)
    crash_at("aside", lambda: commit_folders([tmp_path / "out"], "new", force=True))
    assert tag_of(tmp_path / "out") is None
    wrapper = leftover_of(tmp_path)
    assert recover(tmp_path) == [f"restored {tmp_path / 'out'} (a commit of vecmerge was interrupted)",
                                 f"removed the leftover {wrapper}"]
    assert tag_of(tmp_path / "out") == "old" and hidden(tmp_path) == []


def _journal(wrapper: Path) -> dict:
    return json.loads((wrapper / "journal.json").read_text())


@pytest.mark.parametrize("damage", ["state", "parent", "name", "big", "other-file", "journal-dir"])
def test_recover_trusts_only_a_journal_vecmerge_wrote(tmp_path, damage):
    """A committing leftover whose journal is off in any one way is left exactly as it is (with the line saying
    so): a state other than committing/done, a member whose wrapper is not beside its target or not named after
    it, a journal over 1 MiB, a marker naming another file, a journal that is not a file."""
    parent = tmp_path / "runs"
    commit_folders([parent / "out"], "old")
    crash_at("moved out", lambda: commit_folders([parent / "out"], "new", force=True))
    wrapper = leftover_of(parent)
    plan = _journal(wrapper)
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


@pytest.mark.parametrize("no_swap", [False, True])
@pytest.mark.parametrize("swap", ["user-folder", "user-file-added"])
def test_a_target_changed_between_the_check_and_the_swap_is_put_back(tmp_path, monkeypatch, swap, no_swap):
    """--force replaces only what the check allowed: if, by the swap, the old output was replaced by the user's
    folder (or got a file the user added), that folder goes back untouched and the commit fails. The same without
    an atomic swap, where the old output is moved aside first (before the fix the user's folder was deleted)."""
    commit_folders([tmp_path / "out"], "old")
    if no_swap:
        monkeypatch.setattr(safe_write, "exchange", _no_swap)
        monkeypatch.setattr(safe_recover, "exchange", _no_swap)

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
        monkeypatch.setattr(safe_write, "exchange", _no_swap)
        monkeypatch.setattr(safe_recover, "exchange", _no_swap)
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
