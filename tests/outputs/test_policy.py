"""outputs/policy: which paths may be written; --force replaces only what vecmerge wrote; --plot rules."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from staged_outputs import FILES, PNG_BYTES, commit_folders, hidden, one_line, tag_of

from vecmerge.errors import OutputError
from vecmerge.outputs.policy import PNG, OutputPolicy, Protected
from vecmerge.outputs.transaction import write_file

pytestmark = pytest.mark.skipif(not hasattr(os, "fork") or sys.platform == "win32", reason="POSIX semantics")


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


def test_protected_compares_device_and_inode(tmp_path):
    """A bind-mount-like alias (here: a hard-to-spot second path via a symlinked parent) is caught."""
    (tmp_path / "real" / "v28").mkdir(parents=True)
    os.symlink(tmp_path / "real", tmp_path / "alias")
    policy = OutputPolicy(protected=(Protected(tmp_path / "alias" / "v28", "the input v28"),))
    with pytest.raises(OutputError) as err:
        policy.check_folder(tmp_path / "real" / "v28" / "x")
    one_line(err, "lies inside the input v28")
