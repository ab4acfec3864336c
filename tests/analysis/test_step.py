"""The trust-region step: alpha's closed form, module scope, alpha as a bound, refusals.

References are dense float64 updates read without vecmerge (``dense_expr``: safetensors + PEFT's own
scale rule). Factored alpha and realized steps agree with them to rtol 1e-12 (a ratio of float64 norms);
written fp32 outputs to float32 round-off of the whole update: atol 1e-6 of its largest entry.
"""

import json
import math

import pytest
import torch

from vecmerge.analysis.step import choose_step
from vecmerge.errors import RecipeError
from vecmerge.peft.adapter import Adapter
from vecmerge.pipeline import run
from vecmerge.recipe.recipe import Recipe
from vecmerge.workspace.names import Workspace


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


def _tv(norms: dict):
    """A TaskVector whose module m is the 1x1 update [[norms[m]]] (||x_m|| = |norms[m]|, exact)."""
    from vecmerge.linalg.lowrank import LowRank
    from vecmerge.workspace.taskvector import TaskVector

    return TaskVector({m: LowRank(torch.tensor([[float(v)]], dtype=torch.float64),
                                  torch.ones(1, 1, dtype=torch.float64)) for m, v in norms.items()}, {})


BASE = {"a": 3.0, "b": 4.0, "c": 12.0}      # ||base|| = 13
DIRN = {"a": 1.0, "b": 0.0, "c": 2.0}       # ||dir|| = sqrt(5)


def test_global_step_fields_against_the_closed_form():
    """alpha = T ||base|| / ||dir|| = 0.1 * 13 / sqrt(5); every module gets it; the numbers that justify it are kept.
    rel 1e-15: the same few float64 operations."""
    st = choose_step(_tv(BASE), _tv(DIRN), trust=0.1)
    alpha = 0.1 * 13 / math.sqrt(5)
    assert st.alpha == pytest.approx(alpha, rel=1e-15) and st.module_alpha == {m: st.alpha for m in BASE}
    assert (st.trust, st.scope, st.requested_alpha, st.clipped) == (0.1, "global", None, False)
    assert st.base_norm == pytest.approx(13.0, rel=1e-15) and st.dir_norm == pytest.approx(math.sqrt(5), rel=1e-15)
    assert st.base_module_norms == pytest.approx(BASE, rel=1e-15) and st.dir_module_norms == pytest.approx(DIRN,
                                                                                                        rel=1e-15)
    bound = st.alpha
    at = choose_step(_tv(BASE), _tv(DIRN), trust=0.1, alpha=-bound)  # exactly at the bound: not clipped
    assert (at.alpha, at.clipped, at.requested_alpha) == (-bound, False, -bound)
    free = choose_step(_tv(BASE), _tv(DIRN), alpha=-7.0)
    assert (free.alpha, free.trust, free.clipped) == (-7.0, None, False) and free.module_alpha["b"] == -7.0


def test_module_step_bounds_each_module_by_its_own_norm():
    """Module scope: alpha_m = T ||base_m|| / ||dir_m|| (0 where the direction is zero); with --alpha, each module
    takes min(|alpha|, alpha_m) with alpha's sign, and clipped says whether any was reduced."""
    st = choose_step(_tv(BASE), _tv(DIRN), trust=0.5, scope="module")
    assert st.alpha is None and (st.scope, st.trust, st.clipped) == ("module", 0.5, False)
    assert st.base_norm == pytest.approx(13.0, rel=1e-15) and st.dir_norm == pytest.approx(math.sqrt(5), rel=1e-15)
    assert st.module_alpha == pytest.approx({"a": 1.5, "b": 0.0, "c": 3.0}, rel=1e-15)
    mixed = choose_step(_tv(BASE), _tv(DIRN), trust=0.5, scope="module", alpha=-2.0)
    assert mixed.module_alpha == pytest.approx({"a": -1.5, "b": 0.0, "c": -2.0}, rel=1e-15)
    assert mixed.clipped and mixed.requested_alpha == -2.0
    inside = choose_step(_tv(BASE), _tv({"a": 1.0, "b": 1.0, "c": 1.0}), trust=0.5, scope="module", alpha=1.5)
    assert inside.module_alpha == {"a": 1.5, "b": 1.5, "c": 1.5} and not inside.clipped  # a's bound is 1.5 exactly


def test_step_refusals_word_for_word():
    """What the user reads when no step can be taken: the field, the reason, and what to give instead."""
    cases = [({"base": _tv(BASE), "direction": _tv(DIRN)}, "give trust (a relative step such as 0.0113) or alpha"),
             ({"base": _tv(BASE), "direction": _tv({"a": 0.0, "b": 0.0, "c": 0.0}), "alpha": 1.0},
              "dir: the direction is zero in every module (after mask and mode); nothing to step along (check the "
              "expression, e.g. v51 - v28, and --on-disagree)"),
             ({"base": _tv({"a": 0.0}), "direction": _tv({"a": 1.0}), "trust": 0.1},
              "trust: the backbone is zero, so a step relative to it is empty; use --alpha")]
    for kwargs, message in cases:
        with pytest.raises(RecipeError) as e:
            choose_step(**kwargs)
        assert str(e.value) == f"recipe: {message}"


def test_step_refusals_say_what_to_give():
    with pytest.raises(RecipeError, match=r"^recipe: trust_scope=module needs trust$"):
        choose_step(_tv(BASE), _tv(DIRN), alpha=1.0, scope="module")
    with pytest.raises(RecipeError, match="backbone is zero"):
        choose_step(_tv({"a": 0.0}), _tv({"a": 1.0}), trust=0.1)
    assert choose_step(_tv({"a": 0.0}), _tv({"a": 1.0}), alpha=0.5).alpha == 0.5  # an explicit alpha needs no norm
    with pytest.raises(RecipeError, match="direction is zero in every module"):
        choose_step(_tv(BASE), _tv({"a": 0.0, "b": 0.0, "c": 0.0}), alpha=1.0)


def test_realized_step_figures_against_a_hand_computation():
    """realized(multiple): s_m = |alpha_m * multiple| ||dir_m||, global = sqrt(sum s_m^2) / ||base||, step_norm, and
    min/median/max of s_m / ||base_m|| over modules with both norms non-zero (rel 1e-15)."""
    from vecmerge.analysis.step import StepSize

    dn = {"a": 1.0, "b": 2.0, "c": 0.0, "d": 1.0, "e": 3.0}
    bn = {"a": 4.0, "b": 0.0, "c": 1.0, "d": 2.0, "e": 1.0}
    alpha = {"a": 2.0, "b": -1.0, "c": 5.0, "d": -0.5, "e": 1.0}
    st = StepSize(None, alpha, 0.1, "module", None, False, 10.0, 1.0, bn, dn)
    r = st.realized(3.0)
    s = {m: abs(alpha[m] * 3.0) * dn[m] for m in dn}                  # a 6, b 6, c 0, d 1.5, e 9
    per = sorted(s[m] / bn[m] for m in ("a", "d", "e"))               # 1.5, 0.75, 9
    assert r["step_norm"] == pytest.approx(math.sqrt(sum(v * v for v in s.values())), rel=1e-15)
    assert r["global"] == pytest.approx(r["step_norm"] / 10.0, rel=1e-15)
    assert (r["module_min"], r["module_median"], r["module_max"]) == pytest.approx((per[0], per[1], per[2]), rel=1e-15)
    assert st.realized()["step_norm"] == pytest.approx(r["step_norm"] / 3.0, rel=1e-15)
    flat = StepSize(None, {"a": 1.0}, None, "global", 1.0, False, 0.0, 1.0, {"a": 0.0}, {"a": 1.0}).realized()
    assert flat == {"global": math.inf, "step_norm": 1.0, "module_min": 0.0, "module_median": 0.0, "module_max": 0.0}


def test_trust_alpha_of_a_zero_direction_is_zero():
    from vecmerge.analysis.step import trust_alpha

    assert trust_alpha(3.0, 0.0, 0.5) == 0.0 and trust_alpha(3.0, 2.0, 0.5) == 0.75
