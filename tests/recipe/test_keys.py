"""The table of keys is the one description of a recipe key: the Recipe, the checks and the docs all follow it."""

import dataclasses
import math

import pytest

from vecmerge import methods
from vecmerge.errors import RecipeError
from vecmerge.recipe.docs import recipe_markdown, schema
from vecmerge.recipe.keys import COMMANDS, KEY, KEYS, TOP_LEVEL, of_kind, offered, words
from vecmerge.recipe.recipe import Recipe
from vecmerge.recipe.validate import ORDER
from vecmerge.recipe.values import READERS

BASE = {"base": "v54", "dir": "v51 - v28", "trust": 0.01}


def _problems(data: dict) -> list[str]:
    with pytest.raises(RecipeError) as e:
        Recipe.from_dict(data)
    return e.value.problems


def test_every_recipe_field_is_a_row_and_every_row_is_read():
    """A Recipe field without a row (or a row nothing reads) would be a key explained nowhere (or checked never)."""
    fields = {f.name for f in dataclasses.fields(Recipe)} - {"params"}
    assert set(TOP_LEVEL) == fields | {"mode"}
    assert len({k.name for k in KEYS}) == len(KEYS)
    for k in KEYS:
        parent = k.name.split(".")[0]
        assert parent in TOP_LEVEL, k.name
        assert k.kind in READERS or "." in k.name or k.kind == "method", k.name
        assert k.help and k.describe() and k.takes(), k.name
        assert (k.flag is None) == (not k.commands), k.name
        assert set(k.commands) <= set(COMMANDS), k.name
    assert set(ORDER) == set(READERS)  # every kind is checked, in one stated order


def test_an_unknown_key_lists_the_tables_keys():
    (msg,) = _problems({**BASE, "colour": 1})
    assert msg == f"unknown key(s) ['colour'] (known: {', '.join(TOP_LEVEL)})"


@pytest.mark.parametrize("key", [k for k in of_kind("choice")], ids=lambda k: k.name)
def test_a_choice_key_takes_its_choices_and_names_them(key):
    for choice in key.choices:
        assert getattr(Recipe.from_dict({**BASE, key.name: choice}), key.name) == choice
    assert f"{key.name}='sideways': use one of {', '.join(key.choices)}" in _problems({**BASE, key.name: "sideways"})


@pytest.mark.parametrize("key", [k for k in of_kind("flag")], ids=lambda k: k.name)
def test_a_flag_key_is_true_or_false(key):
    assert getattr(Recipe.from_dict({**BASE, key.name: True}), key.name) is True
    assert _problems({**BASE, key.name: "yes"}) == [f"{key.name}='yes': true or false"]


@pytest.mark.parametrize("key", [k for k in of_kind("number")], ids=lambda k: k.name)
def test_a_number_key_is_finite_and_above_its_bound(key):
    assert getattr(Recipe.from_dict({**BASE, key.name: 2}), key.name) == 2.0
    assert _problems({**BASE, key.name: math.nan}) == [f"{key.name}=nan: a finite number"]
    if key.above is not None:
        assert _problems({**BASE, key.name: key.above}) == [f"{key.name}={key.above!r}: {key.hint}"]


def test_problems_are_listed_kind_by_kind_in_the_tables_order():
    """Kinds in validate.ORDER, keys of a kind in table order: trust before multiple (numbers), dtype after
    trust_scope (choices), whatever the order of the recipe's own keys."""
    got = _problems({"multiple": "x", "dtype": "x", "trust_scope": "x", "base": "v54", "dir": "v51 -", "alpha": 1,
                     "trust": "x", "strict": "x"})
    subjects = [q.split(":")[0].split("=")[0] for q in got]
    assert subjects == ["dir", "trust", "multiple", "trust_scope", "dtype", "strict"]


def test_the_docs_have_a_row_per_key_and_per_method_field():
    rows = schema()
    assert [r[0] for r in rows[:len(KEYS)]] == [k.name if k.alias_of is None else f"{k.name} (or {k.alias_of})"
                                                for k in KEYS]
    assert {r[0] for r in rows[len(KEYS):]} == set(methods.all_fields())
    assert dict((r[0], r[1]) for r in rows)["trust_scope"] == "global | module"
    md = recipe_markdown()
    assert "| `consensus.ref` |" in md and "| `gate.metric` |" in md and "--" not in md.split("| `rank` |")[1][:400]


def test_help_texts_name_keys_as_flags_or_as_keys():
    """``{trust}`` in alpha's help reads ``--trust`` in project's --help and ``trust`` in the recipe docs."""
    alpha = KEY["alpha"]
    assert alpha.describe() == "Alpha directly; with trust, trust bounds it (the report says when it clipped)."
    assert alpha.describe("project", words("project")).startswith("Alpha directly; with --trust, trust bounds it")
    rank = KEY["rank"]
    assert "keep-base" in rank.describe("project") and "keep-base" not in rank.describe("refactor")
    assert "svd and space full" in rank.describe() and "keep-base" in rank.describe()


def test_words_of_a_command_are_its_flags():
    assert words("project")["consensus.ref"] == "--consensus-ref" and words("project")["method"] == "--mode"
    assert words("merge")["method"] == "--method" and "dir" not in words("merge")
    assert {k.name for k in offered("refactor")} == {"rank", "out", "dtype", "allow_missing", "modules_to_save",
                                                     "allow_base_mismatch", "base_model_id", "base_model"}
