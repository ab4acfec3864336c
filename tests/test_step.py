"""The trust-region step: alpha's closed form, module scope, alpha as a bound, refusals.

References are dense float64 updates read without vecmerge (``dense_expr``: safetensors + PEFT's own
scale rule). Factored alpha and realized steps agree with them to rtol 1e-12 (a ratio of float64 norms);
written fp32 outputs to float32 round-off of the whole update: atol 1e-6 of its largest entry.
"""

import json
import math

import pytest
import torch

from vecmerge.adapter import Adapter
from vecmerge.errors import RecipeError
from vecmerge.pipeline import run
from vecmerge.recipe import Recipe
from vecmerge.step import choose_step
from vecmerge.workspace import Workspace


def fro(d):
    return math.sqrt(sum(float((x**2).sum()) for x in d.values()))


def step_of(**recipe):
    return run(Recipe.from_dict({"base": "v54", "dir": "v51-v28", **recipe}), Workspace(), dry_run=True).step


def test_global_trust_alpha_closed_form_and_written_update(toy, run_cli, dense_expr):
    base, d = dense_expr({"v54": 1.0}), dense_expr({"v51": 1.0, "v28": -1.0})
    alpha = 0.0113 * fro(base) / fro(d)
    res = run_cli("project", "--base", "v54", "--dir", "v51-v28", "--trust", "0.0113", "--out", "out/v58", "--json")
    assert res.exit_code == 0, res.output
    rep = json.loads(res.output)
    assert rep["step"]["alpha"] == pytest.approx(alpha, rel=1e-12)
    assert rep["step"]["realized"]["global"] == pytest.approx(0.0113, rel=1e-12)
    assert repr(rep["step"]["alpha"]) in run_cli("project", "--base", "v54", "--dir", "v51-v28", "--trust",
                                                 "0.0113", "--dry-run").output  # full precision in the table
    got = Adapter(toy / "out/v58")
    for m in base:
        want = base[m] + alpha * d[m]
        torch.testing.assert_close(got.factors(m).dense(), want, rtol=0, atol=1e-6 * float(want.abs().max()))
    assert rep["outputs"][0]["figures"]["survival"] == pytest.approx(1.0, abs=1e-4)


def test_module_scope_moves_each_module_by_trust(toy, dense_expr):
    rep = run(Recipe.from_dict({"base": "v54", "dir": "v51-v28", "trust": 0.02, "trust_scope": "module"}),
              Workspace(), dry_run=True).to_dict()
    base = dense_expr({"v54": 1.0})
    st = rep["step"]
    assert st["alpha"] is None
    for key in ("module_min", "module_median", "module_max", "global"):
        assert st["realized"][key] == pytest.approx(0.02, rel=1e-9)
    mods = rep["outputs"][0]["figures"]["modules"]
    for m in base:
        assert mods[m]["step_norm"] / float(torch.linalg.norm(base[m])) == pytest.approx(0.02, rel=1e-9)


def test_alpha_with_trust_is_a_bound(toy):
    free = step_of(alpha=0.01)
    assert free.alpha == 0.01 and not free.clipped
    bound = step_of(alpha=100.0, trust=0.01)
    assert bound.clipped and bound.realized()["global"] == pytest.approx(0.01, rel=1e-12)
    inside = step_of(alpha=1e-4, trust=0.01)
    assert not inside.clipped and inside.alpha == 1e-4


def test_a_negative_alpha_is_clipped_by_its_magnitude(toy):
    """|alpha| is bounded, the sign kept: -100 with trust 0.01 becomes -alpha_T and moves exactly 1%."""
    bound = step_of(alpha=-100.0, trust=0.01)
    free = step_of(trust=0.01)
    assert bound.clipped and bound.alpha == pytest.approx(-free.alpha, rel=1e-15)
    assert bound.realized()["global"] == pytest.approx(0.01, rel=1e-12)
    small = step_of(alpha=-1e-4, trust=0.01)
    assert not small.clipped and small.alpha == -1e-4


def test_zero_direction_or_backbone_with_trust(toy, run_cli):
    res = run_cli("project", "--base", "v54", "--dir", "v51-v51", "--trust", "0.01", "--out", "z")
    assert res.exit_code == 2 and "direction is zero" in res.output and not (toy / "z").exists()
    res = run_cli("project", "--base", "v54-v54", "--dir", "v51-v28", "--trust", "0.01", "--out", "z")
    assert res.exit_code == 2 and "backbone is zero" in res.output and "--alpha" in res.output


def test_choose_step_needs_a_size(toy):
    ws = Workspace()
    with pytest.raises(RecipeError, match="give trust"):
        choose_step(ws.evaluate("v54"), ws.evaluate("v51 - v28"))
