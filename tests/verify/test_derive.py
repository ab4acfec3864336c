"""verify's own derivation: expressions by ``ast`` as ``vecmerge.expr`` reads them, and the intended update of a
project recipe against a dense float64 reference computed here from the safetensors (rel 1e-12)."""

import json
import math
from pathlib import Path

import numpy as np
import pytest

from vecmerge.expr import parse
from vecmerge.recipe.load import with_absolute_inputs
from vecmerge.verify.derive import Uncovered, derive
from vecmerge.verify.expressions import coefficients


@pytest.mark.parametrize("text", ["v54 + 0.12*(v51 - v28)", "-v28", "2*(a-b)", "(a+b)/2", "v1.e2 - 0.5*v1.e2 + b",
                                  "3 * a * 2", "a - a"])
def test_coefficients_agree_with_the_pipelines_parser(text):
    mine = {k: v for k, v in coefficients(text).items()}
    theirs = parse(text).coeffs
    assert set(k for k, v in theirs.items() if v) <= set(mine)
    for k in mine:
        assert mine[k] == pytest.approx(theirs.get(k, 0.0), abs=1e-15)


@pytest.mark.parametrize("text", ["a * b", "2", "a + 1", "f(a)", "a ** 2"])
def test_non_linear_expressions_are_not_covered(text):
    with pytest.raises((Uncovered, SyntaxError)):
        coefficients(text)


def test_the_intended_step_equals_a_dense_reference(toy, run_cli, dense_expr):
    """I_m = v54 + k alpha (v51 - v28) with alpha = T ||v54|| / ||v51 - v28|| from dense float64 norms."""
    res = run_cli("project", "--base", "v54", "--dir", "v51-v28", "--trust", "0.0113", "--dose", "0.5",
                  "--out", "out")
    assert res.exit_code == 0, res.output
    man = with_absolute_inputs(json.loads(Path("out-x0.5/vecmerge.json").read_text()), Path("out-x0.5"))
    d = derive(man)
    base, direction = dense_expr({"v54": 1.0}), dense_expr({"v51": 1.0, "v28": -1.0})
    norm = lambda t: math.sqrt(sum(float((x.double() ** 2).sum()) for x in t.values()))  # noqa: E731
    alpha = 0.0113 * norm(base) / norm(direction)
    assert d.alpha == pytest.approx(0.5 * alpha, rel=1e-12) and d.realized == pytest.approx(0.5 * 0.0113, rel=1e-12)
    for m in base:
        ref = (base[m] + 0.5 * alpha * direction[m]).numpy()
        intended, _, step = d.intended(m)
        got = intended.B @ intended.A
        assert np.linalg.norm(got - ref) <= 1e-12 * np.linalg.norm(ref), m
    d.close()
