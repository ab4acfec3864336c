"""A mergekit file's values: every bad one a single line (exit 2) in mergekit's words, gradients and filters resolved.

The gradient values are checked against mergekit's formula worked by hand here (``t = i / (n - 1)`` per layer of
a slice, linear interpolation between neighbouring values), and the written update of a gradient merge against
the models' dense updates read without vecmerge. mergekit itself checks the same in
tests/methods/test_mergekit_oracle_configs.py (where it is installed).
"""

from __future__ import annotations

import json
import re

import pytest

from vecmerge.errors import RecipeError
from vecmerge.recipe.mergekit import from_mergekit
from vecmerge.recipe.mergekit_values import per_layer, setting
from vecmerge.testing import llm_shapes, toy_adapter

FIVE = llm_shapes(5, 8, 12, 2, 1)  # five layers: a gradient has room to vary


@pytest.fixture
def five(tmp_path, monkeypatch):
    root = tmp_path / "five"
    toy_adapter(root / "a", shapes=FIVE, rank=2, seed=1)
    toy_adapter(root / "b", shapes=FIVE, rank=2, seed=2)
    (root / "vecmerge.yaml").write_text("adapters:\n  a: a\n  b: b\n")
    monkeypatch.chdir(root)
    return root


def _config(root, run_cli, text: str, *flags):
    (root / "c.yml").write_text(text)
    return run_cli("merge", "--config", "c.yml", "--rank", "exact", *flags)


SLICE = "merge_method: ties\nslices:\n  - sources:\n      - {{model: a, layer_range: {r}}}\n      - {{model: b, " \
        "layer_range: {r}}}\n"
BAD = {  # item 9 of issue 36: each was a hang or an internal error (exit 3)
    "layer_range_of_a_billion": (SLICE.format(r="[0, 1000000000]"), "end beyond 4096 layers"),
    "layer_range_beyond_the_model": (SLICE.format(r="[0, 100]"), "beyond the model's 5 layers"),
    "layer_range_one_number": (SLICE.format(r="5"), "layer_range=5: two whole numbers"),
    "layer_range_of_lists": (SLICE.format(r="[[0, 1], [1, 2]]"), "two whole numbers [start, end]"),
    "layer_range_of_booleans": (SLICE.format(r="[true, false]"), "not booleans"),
    "slice_source_a_string": ("merge_method: ties\nslices:\n  - sources: [a, b]\n",
                              "slices[0].sources: a list of mappings"),
    "parameters_a_list": ("merge_method: ties\nmodels:\n  - {model: a, parameters: [1, 2]}\n",
                          "models[0].parameters=[1, 2]: a mapping of mergekit parameters"),
    "parameters_a_word": ("merge_method: ties\nmodels:\n  - {model: a, parameters: abc}\n",
                          "models[0].parameters='abc': a mapping"),
    "weight_of_100k_digits": ("merge_method: linear\nmodels:\n  - {model: a, parameters: {weight: " + "9" * 100000
                              + "}}\n  - b\n", "a number too long to read"),
    "weight_too_large_for_a_float": ("merge_method: linear\nmodels:\n  - {model: a, parameters: {weight: " + "9" * 400
                                     + "}}\n  - b\n", "a gradient (a list of numbers"),
}


@pytest.mark.parametrize("name", BAD)
def test_bad_mergekit_values_are_one_line_exit_2(five, run_cli, name):
    text, want = BAD[name]
    res = _config(five, run_cli, text, "--out", "x")
    assert res.exit_code == 2, res.output
    assert want in res.output and res.output.count("\n") == 1 and len(res.output) < 1200, res.output
    assert "internal error" not in res.output and not (five / "x").exists()


def test_typos_are_answered_with_mergekits_words(five):
    """Item 11: a did-you-mean from mergekit's vocabulary (keys, methods, parameters), never vecmerge's keys."""
    with pytest.raises(RecipeError) as e:
        from_mergekit({"merge_mehtod": "ties", "merge_method": "tie", "models": [
            {"model": "a", "parameters": {"wieght": 1, "densty": 0.5}, "paramters": {}}],
            "parameters": {"normalise": True}}, "f.yml", five)
    text = "\n".join(e.value.problems)
    for want in ("merge_mehtod: not a mergekit key (did you mean 'merge_method'?)",
                 "merge_method='tie': not a mergekit merge_method (did you mean 'ties'?)",
                 "models[0].parameters.wieght: not a mergekit parameter (did you mean 'weight'?)",
                 "models[0].parameters.densty: not a mergekit parameter (did you mean 'density'?)",
                 "models[0].paramters: not a mergekit model key (did you mean 'parameters'?)",
                 "parameters.normalise: not a mergekit parameter (did you mean 'normalize'?)"):
        assert want in text, text
    assert "known:" not in text and "only meaningful with method" not in text  # vecmerge's own wording


def test_a_filter_list_is_not_a_gradient():
    p: list = []
    assert setting([{"filter": "mlp", "value": [0, 1]}, {"value": 0.5}], "parameters.t", p) == \
        [("mlp", [0, 1]), (None, [0.5])]
    assert setting([0, 0.5, 1], "parameters.t", p) == [(None, [0, 0.5, 1])] and not p
    setting([{"filter": "mlp"}], "parameters.t", p)
    assert p and "a filter is a mapping {filter: NAME-PART, value: ...}" in p[0] and "gradient" not in p[0][:40]


def _value(rows, module):
    return next(v for pat, v in rows if re.search(pat, module))


def test_per_layer_values_follow_mergekits_interpolation():
    """gradient-slerp.yml's t: over 5 layers t = 0, .25, .5, .75, 1, and [0, .5, .3, .7, 1] at those points is itself;
    over 3 layers (t = 0, .5, 1) the middle layer sits at 2.0 on the 5-point scale: 0.3."""
    conds = [("self_attn", [0, 0.5, 0.3, 0.7, 1]), ("mlp", [1, 0.5, 0.7, 0.3, 0]), (None, [0.5])]
    rows = per_layer(conds, [(0, 5)])
    got = [_value(rows, f"model.layers.{i}.self_attn.q_proj") for i in range(5)]
    assert got == pytest.approx([0, 0.5, 0.3, 0.7, 1], abs=1e-15)
    assert [_value(rows, f"model.layers.{i}.mlp.up_proj") for i in range(5)] == pytest.approx([1, 0.5, 0.7, 0.3, 0])
    assert _value(rows, "model.layers.3.input_layernorm") == 0.5 and _value(rows, "model.embed_tokens") == 0.5
    rows = per_layer([(None, [1, 0.7, 0.1])], [(2, 5)])  # a slice's own layers: t restarts at its start
    assert [_value(rows, f"model.layers.{i}.mlp.up_proj") for i in (2, 3, 4)] == pytest.approx([1, 0.7, 0.1])
    rows = per_layer([(None, [0, 1])], [(0, 4)])  # between the points: (1 - f) v0 + f v1 at t = 1/3, 2/3
    assert [_value(rows, f"model.layers.{i}.x") for i in range(4)] == pytest.approx([0, 1 / 3, 2 / 3, 1])


def test_a_weight_gradient_scales_each_layer(five, run_cli, dense_updates):
    """task_arithmetic with weight [0, 1] over 5 layers: layer i is (i / 4) * x_a + x_b; mlp filtered to 2 * x_a."""
    res = _config(five, run_cli, "merge_method: task_arithmetic\nmodels:\n  - model: a\n    parameters:\n"
                  "      weight:\n        - {filter: mlp, value: 2}\n        - {value: [0, 1]}\n  - model: b\n",
                  "--out", "g")
    assert res.exit_code == 0, res.output
    assert "config note: gradients or filters of models.0.weight: resolved per module" in res.output
    A, B, got = dense_updates(five / "a"), dense_updates(five / "b"), dense_updates(five / "g")
    for m, x in got.items():
        layer = int(m.split("layers.")[1].split(".")[0])
        w = 2.0 if ".mlp." in m else layer / 4
        assert float((x - (w * A[m] + B[m])).norm() / (w * A[m] + B[m]).norm()) <= 1e-6, m


def test_per_module_rows_are_checked_like_the_keys_they_set(five):
    from vecmerge.recipe.recipe import Recipe

    base = {"method": "task_arithmetic", "models": ["a", "b"]}
    ok = Recipe.from_dict({**base, "per_module": {"models.1.weight": [["mlp", 0.5]], "lambda": [[".*", 2]]}})
    assert ok.per_module == {"models.1.weight": [["mlp", 0.5]], "lambda": [[".*", 2.0]]}
    with pytest.raises(RecipeError) as e:
        Recipe.from_dict({**base, "per_module": {"models.2.weight": [["x", 1]], "t": [["x", 1]],
                                                 "models.0.density": [["x", 2]], "lambda": [["(", 1]]}})
    text = "\n".join(e.value.problems)
    for want in ("per_module.models.2.weight: there is no model 2", "per_module.t: not a field of this method",
                 "density=2: a share in (0, 1]", "'(' is not a regular expression"):
        assert want in text, text
    with pytest.raises(RecipeError, match="per_module: only meaningful with a merge"):
        Recipe.from_dict({"base": "a", "per_module": {"lambda": [[".*", 1]]}})


def test_verify_passes_a_gradient_merge(five, run_cli):
    res = _config(five, run_cli, "merge_method: task_arithmetic\nmodels:\n  - model: a\n    parameters: {weight: "
                  "[0, 1]}\n  - b\n", "--out", "g")
    assert res.exit_code == 0, res.output
    ver = run_cli("verify", "g", "--json")
    assert ver.exit_code == 0, ver.output
    # verify's own path reads per_module module by module (issue 36): its row re-derives the gradient merge
    rep = json.loads(ver.stdout)
    row = next(c for c in rep["checks"] if c["name"] == "independent")
    assert "not_independent" not in rep and row["passed"] and "verify's own float64 path" in row["detail"]
