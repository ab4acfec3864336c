"""errors.Problem: a recipe problem names its keys and reads in recipe words or in flag words, never re-parsed."""

import pytest

from vecmerge.errors import Problem, RecipeError, in_words

FLAGS = {"mode": "--mode", "consensus.ref": "--consensus-ref", "trust": "--trust", "alpha": "--alpha", "dir": "--dir",
         "base": "EXPRESSION"}


@pytest.mark.parametrize("problem, recipe, flags, keys", [
    (Problem("{mode=}onto-ref: needs {consensus.ref} (the reference trajectory)"),
     "mode=onto-ref: needs consensus.ref (the reference trajectory)",
     "--mode onto-ref: needs --consensus-ref (the reference trajectory)", ("mode", "consensus.ref")),
    (Problem("{trust} or {alpha}: one is needed with {dir} (e.g. {trust:}0.0113)"),
     "trust or alpha: one is needed with dir (e.g. trust: 0.0113)",
     "--trust or --alpha: one is needed with --dir (e.g. --trust 0.0113)", ("trust", "alpha", "dir")),
    (Problem.about("trust", "a finite number", given="nan"), "trust=nan: a finite number",
     "--trust nan: a finite number", ("trust",)),
    (Problem.about("base", "{}", "cannot parse"), "base: cannot parse", "EXPRESSION: cannot parse", ("base",)),
    (Problem("{rank=}{}: a {{mapping}}", "'big'"), "rank='big': a {mapping}", "rank='big': a {mapping}", ("rank",)),
    (Problem("{}", "plain text, dir: untouched"), "plain text, dir: untouched", "plain text, dir: untouched", ()),
])
def test_a_problem_reads_in_recipe_words_and_in_flag_words(problem, recipe, flags, keys):
    """Only the marked keys change; a key the flags lack (rank here) keeps its recipe name."""
    assert str(problem) == problem.words() == recipe
    assert problem.words(FLAGS) == flags
    assert problem.keys == keys


def test_values_are_shown_as_given_never_read_as_a_template():
    """User text (a key name, braces, an '=') inside a value is not a key: the regex rewriting this replaces
    turned such words into flags."""
    p = Problem("{only=}{}: selects none of the {} modules", "'{dir}=x dir: trust'", 14)
    assert p.words(FLAGS) == "only='{dir}=x dir: trust': selects none of the 14 modules"
    assert p.words({"only": "--only"}) == "--only '{dir}=x dir: trust': selects none of the 14 modules"


def test_led_by_marks_the_subject_of_a_lower_layers_message_and_nothing_else():
    assert Problem.led_by("rank", "rank='big': use 'exact'").words({"rank": "--rank"}) == "--rank 'big': use 'exact'"
    assert Problem.led_by("out", "out: expected a path").words({"out": "--out"}) == "--out: expected a path"
    assert Problem.led_by("inputs", "inputs.a.path: too long").keys == ("inputs",)
    for text in ("outdated: x", "the out: x", ""):  # not led by the key: kept as it is, no key
        p = Problem.led_by("out", text)
        assert p.words({"out": "--out"}) == text and p.keys == ()


@pytest.mark.parametrize("template, values", [("{dir", ()), ("dir}", ()), ("{}", ()), ("{dir}", ("x",))])
def test_a_malformed_template_fails_where_it_is_written(template, values):
    with pytest.raises(ValueError):
        Problem(template, *values)


def test_recipe_error_keeps_text_and_problems_and_rewords_them():
    e = RecipeError([Problem("{dir}: cannot parse"), "plain"], "recipe")
    assert e.problems == ["dir: cannot parse", "plain"] and str(e) == "recipe: 2 problems: dir: cannot parse; plain"
    assert [q.keys for q in e.details] == [("dir",), ()]
    flagged = e.worded(FLAGS, "options")
    assert str(flagged) == "options: 2 problems: --dir: cannot parse; plain" and e.worded({}).problems == e.problems
    assert e.worded(FLAGS).source == "recipe"
    assert Problem("{dir}") == Problem("{dir}") != Problem("{base}") and len({Problem("{dir}"), Problem("{dir}")}) == 1


def test_in_words_spells_help_texts_the_same_way():
    assert in_words("with {trust}, it bounds; {}", ("add: a step",), FLAGS) == "with --trust, it bounds; add: a step"
    assert in_words("with {trust}, trust bounds it") == "with trust, trust bounds it"
