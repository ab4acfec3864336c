"""Copy me: unit-test a merge before you spend an evaluation slot on it.

    pytest examples/test_my_merge.py

The toy trajectory stands in for your checkpoints (v28, its continuation v51, the backbone v54 and
its previous epoch v54e2); point ``ADAPTERS`` at your own folders instead and keep the assertions:

- ``assert_merge_identity(out)`` re-derives the written adapter from its ``vecmerge.json`` (inputs'
  sha256, alpha, every module's ``scale * B @ A``, config, output sha256); pass
  ``base_model="path/to/base"`` to also load it through PEFT and compare logits.
- ``assert_delta_close(written, expected, rtol)`` checks the update against your own formula, in
  factored form (no dense matrices), with a tolerance you state: 1e-6 for fp32 storage.
"""

import json

import pytest
from click.testing import CliRunner

from vecmerge import Adapter, Recipe, TaskVector, Workspace, run
from vecmerge.cli import main
from vecmerge.testing import assert_delta_close, assert_merge_identity, toy_trajectory

TRUST = 0.0113      # the step is 1.13% of the backbone's norm
FP32_RTOL = 1e-6    # fp32 storage moves the update by ~4e-8 of its norm


@pytest.fixture
def adapters(tmp_path, monkeypatch):
    """Your checkpoints; here a toy trajectory with a vecmerge.yaml naming them, as the cwd."""
    paths = toy_trajectory(tmp_path)
    monkeypatch.chdir(tmp_path)
    return paths


def test_v58_style_step(adapters, tmp_path):
    recipe = Recipe.from_dict({"base": "v54", "dir": "v51 - v28", "trust": TRUST,
                               "consensus": {"ref": "v54 - v54e2", "on_disagree": "fail"},
                               "out": str(tmp_path / "out" / "v58")})
    report = run(recipe, Workspace())
    out = tmp_path / "out" / "v58"

    assert_merge_identity(out)                                  # the manifest's own checks
    ws = Workspace()
    alpha = report.step.alpha
    expected = ws.evaluate("v54") + alpha * ws.evaluate("v51 - v28")
    written = TaskVector.from_adapter(Adapter(out))
    assert_delta_close(written, expected, rtol=FP32_RTOL)       # your own formula
    assert report.step.realized()["global"] == pytest.approx(TRUST, rel=1e-12)
    summary = report.evaluation.consensus.summary
    assert summary["agree"] == summary["modules"]


def test_refactor_via_cli(adapters, tmp_path):
    out = tmp_path / "out" / "avg"
    res = CliRunner().invoke(main, ["--quiet", "refactor", "0.5*v28 + 0.5*v51", "--out", str(out)])
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(main, ["--quiet", "verify", str(out), "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["passed"] is True
    ws = Workspace()
    assert_delta_close(TaskVector.from_adapter(Adapter(out)), ws.evaluate("0.5*v28 + 0.5*v51"), rtol=FP32_RTOL)


def test_a_tampered_upload_is_caught(adapters, tmp_path):
    out = tmp_path / "out" / "v58"
    run(Recipe.from_dict({"base": "v54", "dir": "v51 - v28", "trust": TRUST, "out": str(out)}), Workspace())
    cfg = json.loads((out / "adapter_config.json").read_text())
    cfg["lora_alpha"] *= 2                                     # someone "fixes" the config by hand
    (out / "adapter_config.json").write_text(json.dumps(cfg))
    with pytest.raises(AssertionError, match="adapter_config.json"):
        assert_merge_identity(out)
