"""Nothing lost, nothing silent, through the CLI: one test per way a run could lose data or lie.

Data loss (plots over inputs, --force over the user's folders, races, interrupts and kills during a
replacement, full disks during a ladder), silent wrong results (non-finite intermediates, denormals),
hangs (catastrophic regexes, YAML alias bombs), bad input that was an internal error (exit 3, now exit 2
with one line), and tampering that ``verify`` did not see. Each test rebuilds the
probe's case from the issue's description and checks the user-visible contract: the exit code, one
``error:`` line on stderr naming the file and the way out, nothing written or half-written, inputs
byte-for-byte unchanged (``tree_hashes``), and a final path that always holds a complete output (a
complete output is one that ``vecmerge verify`` passes). Timings are bounded with ``time.monotonic``
(the unguarded cases ran 60-77 s or hung). Numeric claims are compared with ``verify``'s own
tolerances (``outputs.manifest.TOLERANCES``) or exactly.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file, save_file

from vecmerge.outputs import recovery as safe_recover
from vecmerge.outputs import transaction as safe_write
from vecmerge.outputs.rename import SwapUnsupported
from vecmerge.pipeline import run
from vecmerge.recipe.recipe import Recipe
from vecmerge.testing import tree_hashes
from vecmerge.workspace.names import Workspace

REPO = Path(__file__).resolve().parents[2]
STEP = ("project", "--base", "v54", "--dir", "v51-v28", "--trust", "0.0113")
MODULE = "model.layers.1.self_attn.v_proj"
FAST_S = 5.0


def error_line(res, code: int, *needles: str) -> str:
    """The single ``error:`` line of a CLI result with exit ``code``, containing every needle."""
    assert res.exit_code == code, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    assert "internal error" not in lines[0] and "Traceback" not in res.output
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


def hidden(folder: Path) -> list[str]:
    return sorted(n for n in os.listdir(folder) if n.startswith("."))


def recipe_base(out: Path) -> str:
    return json.loads((out / "vecmerge.json").read_text())["recipe"]["base"]


def verified(run_cli, out) -> bool:
    res = run_cli("verify", str(out), "--json")
    return res.exit_code == 0 and json.loads(res.stdout)["passed"]


def _set(data: dict, path: tuple, value) -> None:
    for k in path[:-1]:
        data = data[k]
    data[path[-1]] = value


def edit_config(folder: Path, **changes) -> None:
    cfg = json.loads((folder / "adapter_config.json").read_text())
    cfg.update(changes)
    (folder / "adapter_config.json").write_text(json.dumps(cfg))


# ------------------------------------------------------------------------------------- 1-5 data loss
@pytest.mark.parametrize("force", [(), ("--force",)])
@pytest.mark.parametrize("plot", ["v28/adapter_model.safetensors", "v51/adapter_config.json"])
def test_plot_never_overwrites_an_input(toy, run_cli, plot, force):
    before = tree_hashes(toy)
    res = run_cli("audit", "--ref", "v54-v54e2", "--dir", "v51-v28", "--plot", plot, *force)
    error_line(res, 2, f"--plot {plot}", "lies inside the input", "choose another --plot")
    assert tree_hashes(toy) == before


def test_plot_replaces_only_a_png_and_never_beside_an_adapter(toy, run_cli):
    args = ("audit", "--ref", "v54-v54e2", "--dir", "v51-v28")
    assert run_cli(*args, "--plot", "a.png").exit_code == 0
    first = (toy / "a.png").read_bytes()
    assert first[:8] == b"\x89PNG\r\n\x1a\n"
    error_line(run_cli(*args, "--plot", "a.png"), 2, "already exists; pass --force")
    assert run_cli(*args, "--by", "module", "--plot", "a.png", "--force").exit_code == 0
    (toy / "notes.txt").write_text("mine")
    error_line(run_cli(*args, "--plot", "notes.txt", "--force"), 2, "not a PNG image")
    assert (toy / "notes.txt").read_text() == "mine"
    shutil.copytree(toy / "v28", toy / "elsewhere")  # an adapter folder this command does not read
    error_line(run_cli(*args, "--plot", "elsewhere/heat.png"), 2, "lies in an adapter folder")
    assert hidden(toy) == []


def test_an_output_is_never_written_inside_another_adapter_folder(toy, run_cli):
    assert run_cli("refactor", "v28", "--out", "o").exit_code == 0
    for out in ("o/sub", "o/a/b"):
        error_line(run_cli("refactor", "v51", "--out", out), 2, "lies in an adapter folder (beside")
    assert sorted(os.listdir(toy / "o")) == ["README.md", "adapter_config.json", "adapter_model.safetensors",
                                             "vecmerge.json"] and verified(run_cli, "o")


@pytest.fixture
def workspace_with_base(toy):
    """The toy workspace plus a base model folder it names and a folder of the user's own files."""
    (toy / "base").mkdir()
    (toy / "base" / "config.json").write_text("{}")
    (toy / "notes").mkdir()
    (toy / "notes" / "thesis.tex").write_text("precious")
    with open(toy / "vecmerge.yaml", "a") as f:
        f.write("base_model: base\n")
    return toy


@pytest.mark.parametrize("out, needle", [
    ("v51", "is the workspace adapter 'v51'"),       # not an input of this command, but the workspace's
    ("v28", "is the input v28"),
    ("base", "is the base model"),
    ("notes", "holds no vecmerge.json"),              # the user's folder: --force never deletes it
    (".", "contains the input v28"),
])
def test_force_replaces_only_folders_vecmerge_wrote(workspace_with_base, run_cli, out, needle):
    toy = workspace_with_base
    before = tree_hashes(toy)
    error_line(run_cli("refactor", "v28", "--out", out, "--force"), 2, needle, "choose another --out")
    assert tree_hashes(toy) == before and hidden(toy) == []


def test_force_keeps_files_the_user_added_to_an_output(toy, run_cli):
    assert run_cli("refactor", "v28", "--out", "o").exit_code == 0
    (toy / "o" / "my-notes.md").write_text("mine")
    error_line(run_cli("refactor", "v51", "--out", "o", "--force"), 2, "holds files vecmerge did not write",
               "my-notes.md")
    (toy / "o" / "my-notes.md").unlink()
    assert run_cli("refactor", "v51", "--out", "o", "--force").exit_code == 0  # its own output: replaced
    assert recipe_base(toy / "o") == "v51" and verified(run_cli, "o")


def test_a_target_that_appears_during_the_run_is_left_untouched(toy, run_cli, monkeypatch):
    """Two runs to one --out without --force, the second committing while the first builds: exit 2."""
    calls = []

    def other_run_commits(step):
        if step == "built" and not calls:
            calls.append(step)
            run(Recipe.from_dict({"base": "v51", "out": "o"}), Workspace())  # the other run wins the race

    monkeypatch.setattr(safe_write, "_checkpoint", other_run_commits)
    res = run_cli("refactor", "v28", "--out", "o")
    error_line(res, 2, "--out o", "appeared while vecmerge was writing", "pass --force")
    assert calls and recipe_base(toy / "o") == "v51" and verified(run_cli, "o")
    assert hidden(toy) == []


@pytest.mark.parametrize("step, no_swap", [
    ("moved o", False),  # swapped in atomically, not yet decided
    ("aside", True),     # no atomic swap here: the old output was moved aside, the final path is empty
])
def test_interrupt_at_the_worst_moment_of_a_force_replacement(toy, run_cli, monkeypatch, step, no_swap):
    assert run_cli("refactor", "v28", "--out", "o").exit_code == 0
    old = tree_hashes(toy / "o")

    def interrupt(at):
        if at == step:
            raise KeyboardInterrupt

    def nope(a, b):
        raise SwapUnsupported(95, "no swap here", str(a))

    with monkeypatch.context() as mp:
        mp.setattr(safe_write, "_checkpoint", interrupt)
        if no_swap:
            mp.setattr(safe_write, "exchange", nope)
            mp.setattr(safe_recover, "exchange", nope)
        res = run_cli("refactor", "v51", "--out", "o", "--force")
    error_line(res, 130, "interrupted")
    assert tree_hashes(toy / "o") == old and recipe_base(toy / "o") == "v28" and verified(run_cli, "o")
    assert hidden(toy) == []


CHILD = r'''
import os, sys, time
from vecmerge.outputs import transaction as safe_write
from vecmerge.cli import main

def stop(step):
    if step == os.environ["STOP_AT"]:
        print("AT", step, flush=True)
        time.sleep(60)

safe_write._checkpoint = stop
main(sys.argv[1:])
'''


def cli_child(toy: Path, stop_at: str, *args) -> subprocess.Popen:
    env = dict(os.environ, STOP_AT=stop_at, PYTHONPATH=str(REPO))
    return subprocess.Popen([sys.executable, "-c", CHILD, "--quiet", *args], cwd=toy, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_at(p: subprocess.Popen, step: str) -> None:
    line = p.stdout.readline().strip()
    if line != f"AT {step}":
        p.kill()
        pytest.fail(f"the child did not reach {step}: {line!r} {p.communicate()[1]}")


def test_sigkill_during_a_force_replacement_then_the_next_run_restores(toy, run_cli):
    assert run_cli("refactor", "v28", "--out", "o").exit_code == 0
    old = tree_hashes(toy / "o")
    p = cli_child(toy, "moved o", "refactor", "v51", "--out", "o", "--force")
    wait_at(p, "moved o")
    p.send_signal(signal.SIGKILL)
    p.communicate(timeout=30)
    assert verified(run_cli, "o")                       # the final path holds a complete output (the new one)
    assert any(h.startswith(".o.tmp-") for h in hidden(toy))
    res = run_cli("refactor", "v54", "--out", "other")  # the next run writing here repairs the commit
    assert res.exit_code == 0 and f"note: restored {toy / 'o'}" in res.stdout, res.output
    assert tree_hashes(toy / "o") == old and verified(run_cli, "o") and hidden(toy) == []


def test_sigint_from_outside_exits_130_with_one_line(toy, run_cli):
    assert run_cli("refactor", "v28", "--out", "o").exit_code == 0
    old = tree_hashes(toy / "o")
    p = cli_child(toy, "built", "refactor", "v51", "--out", "o", "--force")
    wait_at(p, "built")
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=30)
    assert p.returncode == 130 and err.strip().splitlines() == [err.strip()] and err.startswith("error: interrupted")
    assert "Aborted!" not in err
    assert tree_hashes(toy / "o") == old and hidden(toy) == []


def test_sigterm_while_building_leaves_no_leftovers(toy, run_cli):
    """The known limit of the write layer (SIGTERM kills without cleanup) is closed by the CLI's handler."""
    p = cli_child(toy, "staged", *STEP, "--dose", "0.5,1", "--out", "lad")
    wait_at(p, "staged")
    assert any(h.startswith(".lad-x0.5.tmp-") for h in hidden(toy))
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=30)
    assert p.returncode == 143 and err.startswith("error: terminated (SIGTERM)") and err.count("\n") == 1
    assert not list(toy.glob("lad*")) and hidden(toy) == []


def _disk_full_on_call(mp, n: int) -> list:
    """The n-th weights file fails as a full disk does (ENOSPC from write) after its first module's bytes."""
    import errno

    from vecmerge.io.safetensors_write import SafetensorsStream

    real_init, real_put, calls = SafetensorsStream.__init__, SafetensorsStream.put, []

    def init(self, path, *args, **kwargs):
        calls.append(path)
        self._fail_at = len(calls) == n
        real_init(self, path, *args, **kwargs)

    def put(self, group, tensors):
        real_put(self, group, tensors)
        if self._fail_at and self._next >= 1:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self.path))

    mp.setattr(SafetensorsStream, "__init__", init)
    mp.setattr(SafetensorsStream, "put", put)
    return calls


def test_a_dose_ladder_is_all_or_nothing_when_the_disk_fills(toy, run_cli, monkeypatch):
    calls = _disk_full_on_call(monkeypatch, 2)
    res = run_cli(*STEP, "--dose", "0.5,1", "--out", "lad")
    error_line(res, 2, "--out lad-x1: cannot write it (No space left on device)", "nothing was written",
               "free some space")
    assert len(calls) == 2 and not list(toy.glob("lad*")) and hidden(toy) == []


def test_a_forced_ladder_that_fails_keeps_every_old_output(toy, run_cli, monkeypatch):
    assert run_cli(*STEP, "--dose", "0.5,1", "--out", "lad").exit_code == 0
    old = {k: tree_hashes(toy / f"lad-x{k}") for k in ("0.5", "1")}
    with monkeypatch.context() as mp:
        _disk_full_on_call(mp, 2)
        error_line(run_cli(*STEP, "--trust", "0.02", "--dose", "0.5,1", "--out", "lad", "--force"), 2,
                   "No space left on device")
    assert {k: tree_hashes(toy / f"lad-x{k}") for k in ("0.5", "1")} == old and hidden(toy) == []


@pytest.mark.skipif(not hasattr(signal, "SIGXFSZ"), reason="needs RLIMIT_FSIZE")
def test_a_real_write_failure_from_the_tensor_writer_is_one_line(toy):
    """The kernel refuses the write (RLIMIT_FSIZE: EFBIG, like ENOSPC an I/O error of the Rust writer)."""
    import resource

    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))

    p = subprocess.run([sys.executable, "-c", "from vecmerge.cli import main; main()", "--quiet", "refactor", "v28",
                        "--out", "o"], cwd=toy, env=dict(os.environ, PYTHONPATH=str(REPO)), capture_output=True,
                       text=True, preexec_fn=limit, timeout=120)
    assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
    assert p.stderr.startswith("error: --out o: cannot write it (File too large); nothing was written")
    assert not (toy / "o").exists() and hidden(toy) == []


def test_rerunning_a_recipe_is_byte_identical(toy, run_cli):
    assert run_cli(*STEP, "--out", "a").exit_code == 0
    assert run_cli("run", "a/vecmerge.json", "--out", "b").exit_code == 0
    for name in ("adapter_model.safetensors", "adapter_config.json"):
        assert (toy / "a" / name).read_bytes() == (toy / "b" / name).read_bytes()
    # the card's title is the output folder's name; the rest is identical
    assert (toy / "a" / "README.md").read_text().replace("# a\n", "# b\n") == (toy / "b" / "README.md").read_text()


# --------------------------------------------------------------------------- 6-7 silent wrong results
@pytest.fixture
def huge_alpha(toy):
    shutil.copytree(toy / "v28", toy / "big")
    edit_config(toy / "big", lora_alpha=1e308)
    return toy


@pytest.mark.parametrize("args, needle", [
    (("refactor", "1e300*v28"), "base (1e+300*v28) reaches"),
    (("refactor", "big"), "base (big) reaches"),                      # lora_alpha: 1e308
    (("refactor", "1e-300*v28"), "too small for float64"),            # was an all-zero adapter too
    ((*STEP[:5], "--alpha", "1e300"), "the step (alpha * dir) reaches"),
    ((*STEP[:5], "--alpha", "1e-300"), "the step (alpha * dir) is at most"),
])
def test_a_non_finite_intermediate_is_an_error_naming_the_module(huge_alpha, run_cli, args, needle):
    res = run_cli(*args, "--out", "o")
    error_line(res, 2, "module model.layers.", needle)
    assert not (huge_alpha / "o").exists() and hidden(huge_alpha) == []


@pytest.mark.parametrize("args, needle", [
    (("inspect", "big"), "the update of"),                           # showed 'norm inf', exit 0
    (("audit", "--ref", "1e300*v54 - v54e2", "--dir", "v51-v28"), "'1e300*v54 - v54e2' reaches"),
    (("audit", "v28", "big"), "'big' reaches"),
])
def test_inspect_and_audit_refuse_overflowing_updates(huge_alpha, run_cli, args, needle):
    error_line(run_cli(*args), 2, "module model.layers.", needle, "too large for float64")


def test_verify_does_not_pass_a_recipe_that_overflows(toy, run_cli):
    """The issue's all-zero output passed 'update' with rel_error NaN: now the recomputation is a failure."""
    assert run_cli("refactor", "v28", "--out", "o").exit_code == 0
    man = json.loads((toy / "o" / "vecmerge.json").read_text())
    man["recipe"]["base"] = "1e300*v28"
    (toy / "o" / "vecmerge.json").write_text(json.dumps(man))
    res = run_cli("verify", "o", "--json")
    assert res.exit_code == 1
    checks = {c["name"]: c for c in json.loads(res.stdout)["checks"]}
    assert not checks["recompute"]["passed"] and "too large for float64" in checks["recompute"]["detail"]
    assert [c for c in checks.values() if c["passed"] and c["name"] in ("update", "step", "figures")] == []


def test_a_nan_figure_never_passes():
    from vecmerge.verify.checks.files import differences, figures_check

    nan = float("nan")
    assert differences(nan, nan, "x") and differences(1.0, nan, "x") and differences(nan, 1.0, "x")
    same = {"figures": {"rel_error": nan}, "modules": {"m": {"rel_error": nan}}}
    assert not figures_check(same, same)["passed"]


def test_denormal_inputs_are_refused_with_the_cause(toy, run_cli):
    shutil.copytree(toy / "v28", toy / "d28")
    sd = load_file(toy / "d28" / "adapter_model.safetensors")
    save_file({k: v * 1e-42 for k, v in sd.items()}, toy / "d28" / "adapter_model.safetensors")
    sub = sum(int(((t != 0) & (t.abs() < torch.finfo(torch.float32).tiny)).sum()) for t in
              load_file(toy / "d28" / "adapter_model.safetensors").values())
    assert sub > 0  # the probe's case: fp32 factors that underflowed to subnormals
    res = run_cli("refactor", "d28", "--out", "o")
    line = error_line(res, 1, "'vecmerge verify' accepts", "nothing written", "input d28 holds",
                      "subnormal", "smallest normal fp32")
    assert "use another checkpoint" in line and not (toy / "o").exists() and hidden(toy) == []


# --------------------------------------------------------------------------------------- 8-9 hangs
PATHOLOGICAL = "(.*)*(.*)*(.*)*(.*)*(.*)*!"


@pytest.mark.parametrize("field", ["rank_pattern", "alpha_pattern"])
@pytest.mark.parametrize("command", [("inspect", "p28"), ("refactor", "p28", "--out", "o")])
def test_a_catastrophic_pattern_ends_in_a_clear_error_within_seconds(toy, run_cli, field, command):
    shutil.copytree(toy / "v28", toy / "p28")
    edit_config(toy / "p28", **{field: {PATHOLOGICAL: 8}})
    t = time.monotonic()
    res = run_cli(*command)
    assert time.monotonic() - t < FAST_S
    error_line(res, 2, str(toy / "p28" / "adapter_config.json"), f"{field} key", "a repeat inside a repeat")


def test_a_catastrophic_target_modules_regex_in_an_output_fails_verify_fast(toy, run_cli):
    assert run_cli("refactor", "v28", "--out", "o").exit_code == 0
    edit_config(toy / "o", target_modules=PATHOLOGICAL)
    t = time.monotonic()
    res = run_cli("verify", "o", "--json")
    assert time.monotonic() - t < FAST_S and res.exit_code == 1
    checks = {c["name"]: c for c in json.loads(res.stdout)["checks"]}
    assert "target_modules" in checks["config"]["detail"] and not checks["config"]["passed"]


def alias_bomb(levels: int = 9) -> str:
    lines = ['a0: &a0 ["lol"]']
    lines += [f"a{k}: &a{k} [" + ", ".join([f"*a{k - 1}"] * 9) + "]" for k in range(1, levels + 1)]
    return "\n".join(lines) + "\n"


def test_a_recipe_alias_bomb_is_refused_fast(toy, run_cli):
    (toy / "bomb.yaml").write_text("base: v54\nout: o\n" + alias_bomb())
    assert (toy / "bomb.yaml").stat().st_size < 1024
    t = time.monotonic()
    res = run_cli("run", "bomb.yaml")
    assert time.monotonic() - t < FAST_S
    line = error_line(res, 2, "bomb.yaml", "anchor (&a0) is not allowed")
    assert len(line) < 300 and not (toy / "o").exists()


def test_a_workspace_alias_bomb_is_refused_fast(toy, run_cli):
    (toy / "ws.yaml").write_text("adapters:\n  v28: v28\n" + alias_bomb())
    t = time.monotonic()
    res = run_cli("--workspace", "ws.yaml", "inspect", "v28")
    assert time.monotonic() - t < FAST_S
    assert len(error_line(res, 2, "ws.yaml", "not allowed")) < 300


# ---------------------------------------------------------------- bad input that was an internal error
def _bin(folder: Path, fn) -> None:
    sd = load_file(folder / "adapter_model.safetensors")
    (folder / "adapter_model.safetensors").unlink()
    torch.save(fn(sd), folder / "adapter_model.bin")


def _raw_config(folder: Path, text: str) -> None:
    (folder / "adapter_config.json").write_text(text)


BAD_ADAPTERS = {
    "invalid regex in rank_pattern": (lambda f: edit_config(f, rank_pattern={"q_proj(": 8}), "not a valid regex"),
    "invalid regex in alpha_pattern": (lambda f: edit_config(f, alpha_pattern={"q_proj(": 8}), "not a valid regex"),
    "lora_alpha NaN": (lambda f: _raw_config(f, '{"r": 8, "lora_alpha": NaN, "target_modules": ["q_proj"]}'),
                       "NaN is not a JSON number"),
    "lora_alpha Infinity": (lambda f: _raw_config(f, '{"r": 8, "lora_alpha": Infinity}'),
                            "Infinity is not a JSON number"),
    ".bin with int keys": (lambda f: _bin(f, lambda sd: dict(enumerate(sd.values()))), "has a key 0 of type int"),
    ".bin with non-tensor values": (lambda f: _bin(f, lambda sd: {k: [1, 2] for k in sd}), "holds a list"),
    "config nested 100k levels": (lambda f: _raw_config(f, "[" * 100_000 + "]" * 100_000), "nested too deeply"),
    "r of 5000 digits": (lambda f: _raw_config(f, '{"r": ' + "9" * 5000 + ', "lora_alpha": 8}'),
                         "an integer of 5000 digits"),
    "target_modules: 5": (lambda f: edit_config(f, target_modules=5), "target_modules=5"),
}


@pytest.mark.parametrize("case", list(BAD_ADAPTERS))
@pytest.mark.parametrize("command", [("inspect", "x28"), ("refactor", "x28", "--out", "o")])
def test_a_hostile_adapter_is_one_line_exit_2(toy, run_cli, case, command):
    shutil.copytree(toy / "v28", toy / "x28")
    make, needle = BAD_ADAPTERS[case]
    make(toy / "x28")
    t = time.monotonic()
    res = run_cli(*command)
    assert time.monotonic() - t < FAST_S
    error_line(res, 2, "x28", needle)
    assert not (toy / "o").exists()


def test_inspect_no_longer_shows_norm_nan(toy, run_cli):
    shutil.copytree(toy / "v28", toy / "x28")
    _raw_config(toy / "x28", '{"r": 8, "lora_alpha": NaN}')
    res = run_cli("inspect", "x28")
    assert res.exit_code == 2 and "nan" not in res.stdout


def test_verify_of_an_output_whose_config_says_target_modules_5_fails_cleanly(toy, run_cli):
    assert run_cli("refactor", "v28", "--out", "o").exit_code == 0
    edit_config(toy / "o", target_modules=5)
    res = run_cli("verify", "o", "--json")
    assert res.exit_code == 1 and "internal error" not in res.output
    checks = {c["name"]: c for c in json.loads(res.stdout)["checks"]}
    assert not checks["output opens"]["passed"] and "target_modules=5" in checks["output opens"]["detail"]


BAD_WORKSPACES = {
    "non-UTF-8 bytes": (b"adapters:\n  v28: v\xff28\n", "not UTF-8 text (byte 0xff"),
    "a NUL in a path": (b'adapters:\n  v28: "v2\\x008"\n', "control character 0x00"),
    "20k levels of nesting": (b"adapters: " + b"[" * 20_000 + b"]" * 20_000 + b"\n", "nested deeper than 64"),
}


@pytest.mark.parametrize("case", list(BAD_WORKSPACES))
def test_a_hostile_workspace_is_one_line_exit_2(toy, run_cli, case):
    text, needle = BAD_WORKSPACES[case]
    (toy / "ws.yaml").write_bytes(text)
    t = time.monotonic()
    res = run_cli("--workspace", "ws.yaml", "inspect", "v28")
    assert time.monotonic() - t < FAST_S
    error_line(res, 2, "ws.yaml", needle)


def test_device_tpu_is_one_line_exit_2(toy, run_cli):
    error_line(run_cli("--device", "tpu", "inspect", "v28"), 2, "--device tpu")


@pytest.mark.parametrize("flag", ["--ref", "--dir"])
def test_audit_with_2000_parentheses_is_one_parse_error(toy, run_cli, flag):
    deep = "(" * 2000 + "v28" + ")" * 2000
    exprs = {"--ref": "v54-v54e2", "--dir": "v51-v28", flag: deep}
    res = run_cli("audit", "--ref", exprs["--ref"], "--dir", exprs["--dir"])
    assert res.exit_code == 2 and res.stderr.startswith("error: cannot parse expression: nested deeper than 64")
    assert "RecursionError" not in res.output and len(res.stderr) < 400


def test_a_library_warning_is_not_printed_before_the_error_line(toy, run_cli, monkeypatch):
    """Like torch's 'CUDA initialization' UserWarning on a machine without a driver."""
    def is_available():
        warnings.warn("CUDA initialization: Found no NVIDIA driver on your system", UserWarning, stacklevel=1)
        return False

    monkeypatch.setattr(torch.cuda, "is_available", is_available)
    with warnings.catch_warnings():
        warnings.simplefilter("default")  # the suite turns warnings into errors; a user's Python does not
        res = run_cli("--device", "cuda", "inspect", "v28")
        error_line(res, 2, "--device cuda: no CUDA device")
        monkeypatch.setattr("vecmerge.commands.adapters.describe", lambda *a, **k: (warnings.warn(
            "a note from a library", UserWarning, stacklevel=1), {})[1])
        monkeypatch.setattr("vecmerge.commands.adapters.render_inspect", lambda infos: "table")
        ok = run_cli("inspect", "v28")
    assert ok.exit_code == 0 and ok.stdout == "table\n"
    assert ok.stderr == "warning: a note from a library (UserWarning)\n"  # after a success: one line, after


def test_keyboard_interrupt_is_exit_130_not_aborted(toy, run_cli, monkeypatch):
    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr("vecmerge.commands.adapters.describe", interrupted)
    error_line(run_cli("inspect", "v28"), 130, "interrupted")


MANIFEST_EDITS = [((k,), v) for k in ("tool", "kind", "method", "resolved", "inputs", "missing_modules", "figures",
                                       "modules", "output") for v in (None, "x", [1], 1e308)] + [
    (("recipe",), "x"), (("recipe", "inputs"), "x"), (("recipe", "consensus", "min_agree"), "x"),
    (("recipe", "trust"), 1e308), (("resolved", "dropped"), 0.5), (("resolved", "realized"), [1]),
    (("modules", MODULE), None), (("modules", MODULE, "rank"), "8"), (("figures", "survival"), None),
    (("figures", "rank"), 3), (("inputs", "v28", "config_sha256"), 0.5), (("output", "dtype"), []),
    (("output", "sha256"), 1), (("inputs", "v28"), "v28")]


def test_verify_of_an_edited_manifest_fails_and_never_crashes(toy, run_cli):
    """Every section (and the fields verify reads) replaced by a value of the wrong type or size: exit 1
    (a failed check) or 2 (a manifest vecmerge did not write), one line, never an internal error or a pass."""
    assert run_cli(*STEP, "--consensus-ref", "v54-v54e2", "--out", "o").exit_code == 0
    original = (toy / "o" / "vecmerge.json").read_text()
    for path, value in MANIFEST_EDITS:
        man = json.loads(original)
        _set(man, path, value)
        (toy / "o" / "vecmerge.json").write_text(json.dumps(man))
        res = run_cli("verify", "o")
        assert res.exit_code in (1, 2), (path, value, res.output)
        assert len(res.stderr.strip().splitlines()) == 1 and "internal error" not in res.stderr, (path, res.stderr)
    (toy / "o" / "vecmerge.json").write_text(original)
    assert verified(run_cli, "o")


# ------------------------------------------------------------------------------------------ tampering

TAMPER = {
    "README.md edited": (lambda o: (o / "README.md").write_text((o / "README.md").read_text() + "\nsafe!\n"),
                         "files", "the model card was edited"),
    "adapter_model.bin added": (lambda o: shutil.copy(o / "adapter_model.safetensors", o / "adapter_model.bin"),
                                "files", "adapter_model.bin"),
    "evil.py added": (lambda o: (o / "evil.py").write_text("import os\n"), "files", "evil.py"),
    "figures.dtype_effect": (("figures", "dtype_effect"), 0.0, "figures", "figures.dtype_effect is 0.0"),
    "figures.rank": (("figures", "rank", "max"), 4, "figures", "figures.rank.max is 4"),
    "resolved.realized": (("resolved", "realized", "global"), 0.02, "manifest", "resolved.realized.global is 0.02"),
    "modules[m].survival": (("modules", MODULE, "survival"), 0.9, "figures", f"modules[{MODULE}].survival is 0.9"),
    "missing_modules": (("missing_modules",), {"v28": [MODULE]}, "manifest", "missing_modules.v28"),
    "output.modules": (("output", "modules"), 13, "manifest", "output.modules is 13"),
    "inputs.v28.sha256 (the card's copy)": (("inputs", "v28", "sha256"), "0" * 64, "manifest",
                                            "inputs.v28.sha256 is '0000"),
}


ALSO_CAUGHT_BY = {"resolved.realized": ["independent"]}


@pytest.mark.parametrize("case", list(TAMPER))
def test_verify_sees_every_tampering(toy, run_cli, case):
    assert run_cli(*STEP, "--out", "o").exit_code == 0
    assert verified(run_cli, "o")
    how, *rest = TAMPER[case]
    if callable(how):
        how(toy / "o")
        check_name, needle = rest
    else:
        value, check_name, needle = rest
        man = json.loads((toy / "o" / "vecmerge.json").read_text())
        _set(man, how, value)
        (toy / "o" / "vecmerge.json").write_text(json.dumps(man))
    res = run_cli("verify", "o", "--json")
    assert res.exit_code == 1, res.output
    checks = {c["name"]: c for c in json.loads(res.stdout)["checks"]}
    also = ALSO_CAUGHT_BY.get(case, [])  # verify's own derivation recomputes some records too (issue 23)
    assert [n for n, c in checks.items() if not c["passed"]] == sorted([check_name, *also], key=list(checks).index)
    assert needle in checks[check_name]["detail"]
    table = run_cli("verify", "o").stdout  # the table says which check caught it
    assert re.search(rf"^{check_name}\s+FAIL\s", table, re.M) and f"FAILED: {1 + len(also)} of {len(checks)}" in table


def test_base_model_with_newlines_cannot_inject_front_matter(toy, run_cli):
    evil = "org/model\nlicense: mit\npipeline_tag: text-generation\n---\n# fake"
    for name in ("v54", "v51", "v28"):
        edit_config(toy / name, base_model_name_or_path=evil)
    assert run_cli(*STEP, "--out", "o").exit_code == 0
    card = (toy / "o" / "README.md").read_text()
    front = card.split("---\n")[1]
    meta = yaml.safe_load(front)
    # a declared base that is not a hub id is not claimed by the card at all (a note says to pass a hub id);
    # where one is written it is quoted, so no line of it can become a key
    assert set(meta) <= {"library_name", "base_model", "tags"} and "license" not in meta
    assert meta.get("base_model", evil) == evil
    assert card.count("\n---\n") == 1  # the front matter closes once, where vecmerge closes it
