"""Toy outputs for the write-safety tests of ``outputs/``: folders whose completeness can be checked.

An "output" here is a folder with three data files and a ``vecmerge.json`` naming its tag; ``tag_of`` reads one
back and fails on anything incomplete, so "the final path holds a complete old or new output" is checked, not
assumed. Crashes are real: a child process (``child``, ``kill_at``) is stopped at a named step of the write (the
``transaction._checkpoint`` test hook) and killed with SIGKILL.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from vecmerge.outputs import rename as safe_rename
from vecmerge.outputs import transaction as safe_write
from vecmerge.outputs.policy import OutputPolicy
from vecmerge.outputs.transaction import OutputTransaction

REPO = Path(__file__).resolve().parents[1]


FILES = ("a.bin", "b.bin", "c.bin")


PNG_BYTES = b"\x89PNG\r\n\x1a\n" + b"\0" * 32


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


CHILD = r'''
import json, os, sys, time
sys.path.insert(0, os.environ["TEST_DIR"])
from staged_outputs import write_output
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


def kill_at(tmp_path: Path, job: dict, step: str) -> None:
    p = child(tmp_path, dict(job, stop_at=step))
    line = p.stdout.readline().strip()
    if line != f"AT {step}":
        p.kill()
        pytest.fail(f"child did not reach {step}: {line!r} {p.communicate()[1]}")
    p.send_signal(signal.SIGKILL)
    p.communicate(timeout=30)  # reaps it and closes the pipes
    assert p.returncode == -signal.SIGKILL


def refuse_swap(a, b):
    raise safe_rename.SwapUnsupported(errno.ENOTSUP, "no swap", str(a))


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


def journal_of(wrapper: Path) -> dict:
    return json.loads((wrapper / "journal.json").read_text())
