"""verify's own derivation: expressions by ``ast`` as ``vecmerge.expr`` reads them, and the intended update of a
project recipe against a dense float64 reference computed here from the safetensors (rel 1e-12)."""

import json
import math
from pathlib import Path

import numpy as np
import pytest

from vecmerge.expr import parse
from vecmerge.recipe.load import with_absolute_inputs
from vecmerge.verify.independent.derive import Uncovered, derive
from vecmerge.verify.independent.expressions import coefficients


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


@pytest.mark.parametrize("text, want", [("+a", {"a": 1.0}), ("-0.5*a + +b", {"a": -0.5, "b": 1.0}),
                                        ("(-3)*a", {"a": -3.0}), ("a/1", {"a": 1.0}), ("(2*3)*a", {"a": 6.0}),
                                        ("(1/4)*a - -b", {"a": 0.25, "b": 1.0}), ("-(a - 2*b)", {"a": -1.0, "b": 2.0})])
def test_signs_and_constant_arithmetic(text, want):
    assert coefficients(text) == pytest.approx(want, abs=0.0)
    assert coefficients(text) == pytest.approx(parse(text).coeffs, abs=0.0)


@pytest.mark.parametrize("text, says", [("a + 1", "adds a number to an adapter"), ("2", "names no adapter"),
                                        ("a / 0", "is not linear in the adapters"),
                                        ("f(a).b", "is not linear in the adapters"),
                                        ("(2**3)*a", "is not linear in the adapters"),
                                        ("(1/0)*a", "is not linear in the adapters")])
def test_what_is_not_covered_says_why(text, says):
    with pytest.raises(Uncovered) as e:
        coefficients(text)
    assert says in str(e.value) and repr(text) in str(e.value)


def test_the_message_of_a_non_linear_term_shows_its_node():
    import ast

    with pytest.raises(Uncovered) as e:
        coefficients("a * b")
    node = ast.parse("a * b", mode="eval").body
    assert str(e.value) == f"expression 'a * b': {ast.dump(node)[:40]} is not linear in the adapters"


def test_a_long_expression_is_named_by_its_first_40_characters(monkeypatch):
    from vecmerge.verify.independent import expressions

    text = " + ".join(f"x{i}" for i in range(30))
    monkeypatch.setattr(expressions, "MAX_NODES", 3)
    with pytest.raises(Uncovered) as e:
        coefficients(text)
    assert str(e.value) == f"expression {text[:40]!r} is too long"


def test_the_node_bound_is_sharp(monkeypatch):
    import ast

    from vecmerge.verify.independent import expressions

    text = " + ".join(f"x{i}" for i in range(30))
    nodes = sum(1 for _ in ast.walk(ast.parse(text, mode="eval")))
    monkeypatch.setattr(expressions, "MAX_NODES", nodes)
    assert len(coefficients(text)) == 30
    monkeypatch.setattr(expressions, "MAX_NODES", nodes - 1)
    with pytest.raises(Uncovered, match="too long"):
        coefficients(text)
