"""The method registry: project's modes against dense references, and a method added from a test file.

References are dense float64 updates read without vecmerge (``dense_expr``); the modes' alphas agree
with them to rtol 1e-9 and their orthogonality holds to 1e-12 of ||base||^2.
"""

import json

import pytest
from conftest import SPLIT_DISAGREE as DISAGREE  # noqa: E402
from conftest import fro  # noqa: E402

from vecmerge import methods
from vecmerge.errors import RecipeError
from vecmerge.methods import Field, Method
from vecmerge.pipeline import run
from vecmerge.recipe.recipe import Recipe
from vecmerge.report.merge import render_merge
from vecmerge.verify.checks.output import verify_output
from vecmerge.workspace.names import Workspace


def test_onto_ref_and_orthogonal_against_dense(split, dense_expr):
    base, d = dense_expr({"v54": 1.0}), dense_expr({"v51": 1.0, "v28": -1.0})
    ref = dense_expr({"v54": 1.0, "v54e2": -1.0})
    for mode in ("onto-ref", "orthogonal"):
        rec = {"base": "v54", "dir": "v51-v28", "trust": 0.01, "mode": mode,
               "consensus": {"ref": "v54-v54e2", "on_disagree": "keep"}}
        rep = run(Recipe.from_dict(rec), Workspace(), dry_run=True).to_dict()
        shaped = {}
        for m in base:
            if mode == "onto-ref":
                c = float((d[m] * ref[m]).sum() / (ref[m] ** 2).sum())
                shaped[m] = max(c, 0.0) * ref[m]
            else:
                c = float((d[m] * base[m]).sum() / (base[m] ** 2).sum())
                shaped[m] = d[m] - c * base[m]
        alpha = 0.01 * fro(base) / fro(shaped)
        assert rep["step"]["alpha"] == pytest.approx(alpha, rel=1e-9)
        if mode == "onto-ref":
            assert rep["outputs"][0]["figures"]["modules"][DISAGREE]["step_norm"] == 0.0
            assert rep["step"]["zeroed"] == [DISAGREE]  # reported, not silent
        else:
            for m in base:  # the residual is orthogonal to the backbone module
                assert abs(float((shaped[m] * base[m]).sum())) < 1e-12 * fro(base) ** 2


def test_registry_names_and_unknown_method():
    assert methods.names(stepped=True) == ("add", "onto-ref", "orthogonal")
    assert "expression" in methods.names(stepped=False)
    with pytest.raises(RecipeError, match="method='sideways': use one of"):
        methods.get("sideways")
    assert methods.get("add").space == "core"


class HalfStep(Method):
    """A toy stepped method: ``dir'_m = factor * dir_m`` on the top half of the layers, 0 elsewhere."""

    name = "toy-half"
    summary = "a test method"
    operands = ("base", "dir")
    stepped = True
    fields = (Field("factor", "multiply the direction by this", default=0.5, low=0.0),)

    def validate(self, recipe):
        return [] if recipe.params.get("factor", 0.5) != 0.25 else ["factor=0.25: the test refuses it"]

    def module(self, x, params):
        return x.dir * params["factor"] if ".layers.1." in x.name else x.dir * 0.0


@pytest.fixture
def toy_method():
    methods.register(HalfStep)
    yield methods.get("toy-half")
    methods.unregister("toy-half")


def test_a_method_registered_from_a_test_runs_through_project_verify_and_report(toy, toy_method, dense_expr,
                                                                                run_cli):
    """Adding a method needs only its class: the recipe, the pipeline, verify and the report take it as it is."""
    rec = {"base": "v54", "dir": "v51 - v28", "alpha": 0.1, "mode": "toy-half", "factor": 2.0, "out": "toy"}
    rep = run(Recipe.from_dict(rec), Workspace())
    assert rep.evaluation.method is toy_method
    base, d = dense_expr({"v54": 1.0}), dense_expr({"v51": 1.0, "v28": -1.0})
    from vecmerge.peft.adapter import Adapter

    out = Adapter(toy / "toy")
    for m in base:
        want = base[m] + (0.2 * d[m] if ".layers.1." in m else 0.0)
        err = float((out.factors(m).dense() - want).norm() / want.norm())
        assert err < 1e-6, m
    assert set(rep.evaluation.zeroed) == {m for m in base if ".layers.0." in m}
    assert "mode=toy-half" in render_merge(rep)
    man = json.loads((toy / "toy" / "vecmerge.json").read_text())
    assert man["method"] == "toy-half" and man["recipe"]["factor"] == 2.0
    assert verify_output(toy / "toy")["passed"]
    (toy / "toy.yaml").write_text("base: v54\ndir: v51 - v28\nalpha: 0.1\nmethod: toy-half\nfactor: 2.0\nout: toy2\n")
    assert run_cli("run", "toy.yaml").exit_code == 0
    assert json.loads((toy / "toy2" / "vecmerge.json").read_text())["output"]["sha256"] == man["output"]["sha256"]
    with pytest.raises(RecipeError) as e:
        Recipe.from_dict({**rec, "factor": -1.0, "colour": 1})
    assert "factor=-1.0: between 0 and inf" in str(e.value) and "colour" in str(e.value)
    with pytest.raises(RecipeError, match="the test refuses it"):
        Recipe.from_dict({**rec, "factor": 0.25})
    with pytest.raises(RecipeError, match="factor: only meaningful with method toy-half"):
        Recipe.from_dict({"base": "v54", "factor": 2.0})
