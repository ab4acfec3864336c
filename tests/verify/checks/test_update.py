"""verify's ``update`` check (``verify.update``) on rank-cut outputs: two-sided and first order (issue 36).

A cut output is compared with its recorded per-module error, ``|recomputed - recorded| <= tol`` either way, and
must be I cut on its own column space, ``||W - P_W I|| <= tol ||I||``. References: the recorded errors of the
manifest the pipeline wrote (the cut's own Eckart-Young sum), Pythagoras for the size of a scaled cut.
"""

import json
import math
from pathlib import Path

import pytest

from vecmerge.testing import forge_tensor
from vecmerge.verify.checks.output import verify_output

MODULE = "model.layers.1.self_attn.v_proj"


@pytest.fixture(autouse=True)
def pipeline_update_check(monkeypatch):
    """The pipeline's update row runs here although verify's own path covers these recipes (it runs for those it
    does not cover): these tests pin that row; the own path's row is checked beside it."""
    monkeypatch.setattr("vecmerge.verify.checks.output.own_path_compared", lambda rows: False)


def by_name(res) -> dict:
    return {c["name"]: c for c in res["checks"]}


@pytest.fixture
def cut_output(toy, run_cli) -> Path:
    res = run_cli("project", "--base", "v54", "--dir", "v51-v28", "--trust", "0.05", "--rank", "4", "--out", "out")
    assert res.exit_code == 0, res.output
    return toy / "out"


@pytest.mark.parametrize("factor", [1.5, 1 / 1.5])
def test_a_recorded_cut_error_raised_or_lowered_1_5x_fails_the_update_row_itself(cut_output, factor):
    """The mutant of issue 36: the update check made one-sided (recomputed - recorded <= tol) passes a raised
    record, and only other rows (figures, independent) caught it. The update row must name the module itself."""
    man = json.loads((cut_output / "vecmerge.json").read_text())
    recorded = man["modules"][MODULE]["rel_error"]
    assert recorded > 1e-3  # a real cut: 1.5x is far outside 1e-5 either way
    man["modules"][MODULE]["rel_error"] = recorded * factor
    (cut_output / "vecmerge.json").write_text(json.dumps(man, indent=2))
    res = by_name(verify_output(cut_output))
    upd = res["update"]
    assert not upd["passed"] and upd["figures"]["bad_modules"] == [MODULE]
    assert f"cut error recomputes to {recorded:.6e}" in upd["detail"] and repr(recorded * factor) in upd["detail"]
    assert not res["independent"]["passed"] and MODULE in res["independent"]["detail"]


def test_a_0_01_percent_edit_of_a_cut_module_moves_the_projected_residual_to_first_order(cut_output):
    """Clean: W is exactly a cut, max_projected is fp32 round-off (below 2e-7). One module's B times 1 + 1e-4
    (re-pinned): W' = (1 + e) W with W = P_W I, so ||W' - P_W I|| / ||I|| = e ||W|| / ||I|| = e sqrt(1 - err^2)
    (Pythagoras for an optimal cut, err the recorded relative cut error), rtol 1e-2 (fp32 rounding of W')."""
    upd = by_name(verify_output(cut_output))["update"]
    assert upd["passed"] and upd["figures"]["max_projected"] < 2e-7
    rec = json.loads((cut_output / "vecmerge.json").read_text())["modules"][MODULE]["rel_error"]
    forge_tensor(cut_output, f"{MODULE}.lora_B", lambda t: t * (1 + 1e-4))
    upd = by_name(verify_output(cut_output))["update"]
    assert not upd["passed"] and upd["figures"]["bad_modules"] == [MODULE]
    assert upd["figures"]["max_projected"] == pytest.approx(1e-4 * math.sqrt(1 - rec**2), rel=1e-2)
