"""A recipe's problems carry the keys they are about: every key they name exists, and the rules name theirs."""

import pytest

from vecmerge import methods
from vecmerge.errors import RecipeError
from vecmerge.recipe.keys import KEY
from vecmerge.recipe.recipe import Recipe

BAD = [
    {"dir": "v51 - ", "trust": -1, "mode": "sideways", "rank": "big", "consensus": {"ref": "x -", "on_disagree": "x",
                                                                                     "min_agree": 2, "y": 1}},
    {"base": "a", "dir": "b", "trust_scope": "module", "alpha": 1, "rank": "step-energy:2", "dose": [0]},
    {"base": "a + b", "dir": "b", "trust": 0.1, "rank": "keep-base", "mode": "onto-ref", "gate": "x", "out": ""},
    {"base": "a", "trust": 0.1, "consensus": "c", "dose": [1], "gate": True, "rank": "step-energy:0.5"},
    {"method": "linear", "models": ["a"], "base": "a", "dir": "b", "trust": 1, "rank": "keep-base", "t": 1},
    {"method": "ties", "models": ["a", {"model": "b -", "weight": "x", "colour": 1}], "density": 0},
    {"method": "slerp", "models": [{"model": "a", "weight": 2, "density": 0.5}, "b", "c"]},
    {"method": "svd", "models": ["a"], "only": "(", "multipliers": {"(": 1, "x": "y"}, "inputs": {"a": 5}},
    {"method": "cat", "models": ["a"], "rank": 4, "base_model_id": "../x", "strict": "yes", "space": "x"},
    {"models": ["a"]}, {"method": "linear"}, {"base": "a", "method": "add", "mode": "orthogonal"},
]


def _details(data):
    with pytest.raises(RecipeError) as e:
        Recipe.from_dict(data)
    return e.value.details


@pytest.mark.parametrize("data", BAD)
def test_a_problem_names_only_keys_that_exist(data):
    """A misspelt key in a message would read as a key in recipe words but never become a flag."""
    known = set(KEY) | set(methods.all_fields()) | {"weights"}  # weights: merge's --weights (models' weights)
    for q in _details(data):
        assert set(q.keys) <= known, (q.template, q.keys)
        assert q.keys or q.template.startswith(("unknown key(s)", "{}")), q  # else it names the key it is about


@pytest.mark.parametrize("data, keys", [
    ({"base": "a", "dir": "b", "trust": 0.1, "mode": "onto-ref"}, [("mode", "consensus.ref")]),
    ({"base": "a", "dir": "b"}, [("trust", "alpha", "dir")]),
    ({"base": "a", "dir": "b", "alpha": 1, "trust_scope": "module"}, [("trust_scope", "trust")]),
    ({"base": "a + b", "dir": "b", "trust": 0.1, "rank": "keep-base"}, [("rank",)]),
    ({"method": "svd", "models": ["a"]}, [("method", "rank")]),
    ({"method": "ties", "models": ["a"], "rank": 4}, [("method", "density")]),
    ({"base": "a", "dir": "b", "alpha": 1, "consensus": {"ref": "c", "min_agree": 2}}, [("consensus.min_agree",)]),
    ({"base": "a", "trust": 0.1}, [("trust", "dir")]),
])
def test_the_rules_across_keys_name_their_keys(data, keys):
    assert [q.keys for q in _details(data)] == keys
