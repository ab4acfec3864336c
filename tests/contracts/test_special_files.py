"""Issue 23: a FIFO where a stranger's file is read is refused before it is opened, by every command.

Opening a FIFO blocks until a writer comes: ``fuse`` hung forever on a base whose ``model.safetensors`` was
one. Each case runs the real CLI in a child process with a timeout (a hang fails the test instead of hanging
it) and must end at once with exit 2 and one ``error:`` line naming the file; nothing is written.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from vecmerge.testing import toy_adapter

REPO = Path(__file__).resolve().parents[2]
CHILD = "import sys\nfrom vecmerge.cli import main\nmain(sys.argv[1:])\n"
TIMEOUT = 120  # generous for a loaded machine: the child imports torch; a hang never ends


def fifo(path: Path) -> Path:
    if path.exists():
        path.unlink()
    os.mkfifo(path)
    return path


def model_folder(root: Path) -> Path:
    """A folder ``model_folder_problem`` accepts, whose weights are never read before the FIFO in question."""
    root.mkdir(parents=True)
    (root / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (root / "model.safetensors").write_bytes(b"")
    return root


def _fuse(tmp: Path) -> list:
    toy_adapter(tmp / "a")
    fifo(model_folder(tmp / "base") / "model.safetensors")
    return ["fuse", "a", "--base-model", "base", "--out", "o"]


def _extract(tmp: Path) -> list:
    model_folder(tmp / "tuned")
    fifo(model_folder(tmp / "base") / "model.safetensors")
    return ["extract", "--base-model", "base", "--tuned", "tuned", "--rank", "2", "--out", "o"]


def _extract_config(tmp: Path) -> list:
    model_folder(tmp / "tuned")
    fifo(model_folder(tmp / "base") / "config.json")
    return ["extract", "--base-model", "base", "--tuned", "tuned", "--rank", "2", "--out", "o"]


def _adapter_weights(tmp: Path) -> list:
    fifo(toy_adapter(tmp / "a") / "adapter_model.safetensors")
    return ["refactor", "a", "--out", "o"]


def _adapter_config(tmp: Path) -> list:
    fifo(toy_adapter(tmp / "a") / "adapter_config.json")
    return ["refactor", "a", "--out", "o"]


def _workspace(tmp: Path) -> list:
    toy_adapter(tmp / "a")
    fifo(tmp / "vecmerge.yaml")
    return ["ls"]


def _recipe(tmp: Path) -> list:
    toy_adapter(tmp / "a")
    fifo(tmp / "r.yaml")
    return ["run", "r.yaml"]


def _prompts(tmp: Path) -> list:
    toy_adapter(tmp / "a")
    model_folder(tmp / "base")
    fifo(tmp / "p.jsonl")
    return ["probe", "a", "--prompts", "p.jsonl", "--base-model", "base"]


def _tokenizer(tmp: Path) -> list:
    toy_adapter(tmp / "a")
    fifo(model_folder(tmp / "base") / "tokenizer.json")
    (tmp / "p.jsonl").write_text('{"id": 1, "prompt": "hi", "target": "there"}\n')
    return ["probe", "a", "--prompts", "p.jsonl", "--base-model", "base"]


def _ledger(tmp: Path) -> list:
    toy_adapter(tmp / "a")
    (tmp / "vecmerge.yaml").write_text("adapters: {a: a}\n")
    fifo(tmp / "vecmerge-evidence.db")
    return ["evidence", "show"]


CASES = {"fuse base weights": (_fuse, "base/model.safetensors"),
         "extract base weights": (_extract, "base/model.safetensors"),
         "extract base config": (_extract_config, "base/config.json"),
         "adapter weights": (_adapter_weights, "a/adapter_model.safetensors"),
         "adapter config": (_adapter_config, "a/adapter_config.json"),
         "vecmerge.yaml": (_workspace, "vecmerge.yaml"),
         "recipe": (_recipe, "r.yaml"),
         "prompts": (_prompts, "p.jsonl"),
         "tokenizer": (_tokenizer, "base/tokenizer.json"),
         "ledger": (_ledger, "vecmerge-evidence.db")}


@pytest.mark.parametrize("case", list(CASES))
def test_a_fifo_is_refused_at_once_with_one_line(tmp_path, case):
    if "MUTANT_UNDER_TEST" in os.environ:  # make mutate: a child process outside mutmut's folder cannot run its code
        pytest.skip("child processes do not run under mutmut")
    make, name = CASES[case]
    args = make(tmp_path)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    try:
        res = subprocess.run([sys.executable, "-c", CHILD, *args], cwd=tmp_path, env=env, capture_output=True,
                             text=True, timeout=TIMEOUT, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{case}: vecmerge {' '.join(args)} still running after {TIMEOUT} s (it opened the FIFO)")
    assert res.returncode == 2, res.stdout + res.stderr
    assert res.stderr.startswith("error: ") and res.stderr.count("\n") == 1, res.stderr
    assert name in res.stderr and "is a FIFO (named pipe), not a regular file" in res.stderr, res.stderr
    assert not (tmp_path / "o").exists()
