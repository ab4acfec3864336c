"""``pipeline.self_check``: an output verify would refuse is not written, and the message gives the real cause."""

from __future__ import annotations

import shutil

import pytest
from safetensors.torch import load_file, save_file


@pytest.fixture
def twice(toy):
    """v28 stored a second time as c28 with other factors of the same update (B x 2, A / 2: exact in binary)."""
    shutil.copytree(toy / "v28", toy / "c28")
    sd = load_file(toy / "c28" / "adapter_model.safetensors")
    save_file({k: v * 2 if "lora_B" in k else v / 2 for k, v in sd.items()}, toy / "c28" / "adapter_model.safetensors",
              metadata={"format": "pt"})
    (toy / "vecmerge.yaml").write_text((toy / "vecmerge.yaml").read_text() + "  c28: c28\n")
    return toy


@pytest.mark.parametrize("expr", ["v28 - c28", "v28 + (-1)*c28", "0.5*v28 - 0.5*c28"])
def test_a_cancelling_merge_is_diagnosed_as_zero_up_to_round_off(twice, run_cli, expr):
    """Issue 23: a merge whose terms cancel blamed "rounding to fp32"; the intended update is zero up to
    round-off (what is left is the inputs' rounding, which no dtype reproduces)."""
    res = run_cli("refactor", expr, "--out", "o")
    assert res.exit_code == 1 and res.stderr.count("\n") == 1, res.output
    assert "Cause: the intended update is zero up to round-off" in res.stderr, res.stderr
    assert "rounding to fp32" not in res.stderr and "drop the cancelling terms" in res.stderr
    assert not (twice / "o").exists()


def test_a_small_update_that_does_not_cancel_is_written(twice, run_cli):
    """The test is relative to the terms: a tiny coefficient is an update, not a cancellation."""
    assert run_cli("refactor", "1e-9*v28", "--out", "tiny").exit_code == 0
    assert run_cli("refactor", "v28 - 0.999*c28", "--out", "diff").exit_code == 0
    assert run_cli("verify", "diff").exit_code == 0
