"""verify's own derivation: expressions by ``ast`` as ``vecmerge.expr`` reads them, and the intended update of a
project recipe against a dense float64 reference computed here from the safetensors (rel 1e-12)."""

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
from safetensors.torch import load_file, save_file

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


def test_a_project_allow_missing_output_whose_backbone_lacks_a_module_passes_verify(toy, run_cli, dense_expr):
    """Issue 36 item 4: the backbone lacks a module the direction has. The output holds it (the base counts as
    zero there: I_m = alpha dir_m), verify's own path derives the same module set and alpha, and verify passes.
    Reference: dense float64 from the safetensors, alpha = T ||base|| / ||dir|| over the union (rel 1e-12)."""
    gone = "model.layers.1.self_attn.v_proj"
    shutil.copytree("v54", "v54m")
    kept = {k: v for k, v in load_file("v54m/adapter_model.safetensors").items() if gone not in k}
    save_file(kept, "v54m/adapter_model.safetensors", metadata={"format": "pt"})
    res = run_cli("project", "--base", "v54m", "--dir", "v51-v28", "--trust", "0.05", "--allow-missing", "--out", "o")
    assert res.exit_code == 0, res.output
    ver = json.loads(run_cli("verify", "o", "--json").stdout)
    assert ver["passed"] and "not_independent" not in ver, [c for c in ver["checks"] if not c["passed"]]
    d = derive(with_absolute_inputs(json.loads(Path("o/vecmerge.json").read_text()), Path("o")))
    base, direction = dense_expr({"v54m": 1.0}), dense_expr({"v51": 1.0, "v28": -1.0})
    assert gone not in base and set(d.names) == set(direction)
    norm = lambda t: math.sqrt(sum(float((x.double() ** 2).sum()) for x in t.values()))  # noqa: E731
    alpha = 0.05 * norm(base) / norm(direction)
    assert d.alpha == pytest.approx(alpha, rel=1e-12)
    intended = d.intended(gone)[0]
    ref = (alpha * direction[gone]).numpy()
    assert np.linalg.norm(intended.B @ intended.A - ref) <= 1e-12 * np.linalg.norm(ref)
    d.close()


GRADIENT_TIES = """merge_method: ties
base_model: Qwen/Qwen3-0.6B
models:
  - model: v54
    parameters: {density: [1, 0.7, 0.1], weight: 1.0}
  - model: v51
    parameters: {density: 0.5, weight: [0, 0.3, 0.7, 1]}
parameters: {normalize: true}
"""
GRADIENT_SLERP = """merge_method: slerp
base_model: v54
slices:
  - sources:
      - {model: v54, layer_range: [0, 2]}
      - {model: v51, layer_range: [0, 2]}
parameters:
  t:
    - {filter: self_attn, value: [0, 0.5, 0.3, 0.7, 1]}
    - {filter: mlp, value: [1, 0.5, 0.7, 0.3, 0]}
    - value: 0.5
"""


@pytest.mark.parametrize("config", [GRADIENT_TIES, GRADIENT_SLERP], ids=["ties", "slerp"])
def test_per_module_values_are_read_module_by_module(toy, run_cli, config):
    """mergekit's gradients and filters (``per_module``): covered by verify's own path, and each row matters."""
    from vecmerge.outputs.manifest import TOLERANCES
    from vecmerge.verify.independent.derive import module_recipe
    from vecmerge.verify.independent.independent import independent_check

    Path("m.yml").write_text(config)
    res = run_cli("merge", "--config", "m.yml", "--rank", "8", "--out", "out")
    assert res.exit_code == 0, res.output
    man = with_absolute_inputs(json.loads(Path("out/vecmerge.json").read_text()), Path("out"))
    rows = man["recipe"]["per_module"]
    assert rows and independent_check(Path("out"), man, TOLERANCES["fp32"])["passed"]
    key = next(iter(rows))
    first = module_recipe(man["recipe"], "model.layers.0.self_attn.q_proj")
    field = key.split(".")[-1]
    got = first["models"][int(key.split(".")[1])][field] if key.startswith("models.") else first[field]
    assert got == next(v for p, v in rows[key] if __import__("re").search(p, "model.layers.0.self_attn.q_proj"))
    rows[key][0][1] = 0.45  # another value for the modules the first row holds
    row = independent_check(Path("out"), man, TOLERANCES["fp32"])
    assert not row["passed"] and "do not hold the intended update" in row["detail"]
