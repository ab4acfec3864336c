"""The flags that build a recipe are generated from the table of keys, and a recipe problem names the flags typed."""

import click
import pytest

from vecmerge import methods
from vecmerge.cli import main, recipe_flags
from vecmerge.methods import Method
from vecmerge.recipe.keys import KEYS, offered


@pytest.mark.parametrize("command", ["project", "merge", "refactor", "run"])
def test_a_commands_recipe_flags_are_the_tables(command):
    """Flag, Python name, choices, default, required and help of every option come from the key's row."""
    cmd = main.commands[command]
    opts = {p.opts[0]: p for p in cmd.params if isinstance(p, click.Option)}
    flags = recipe_flags.flag_words(command)
    for key in offered(command):
        opt = opts[key.flag]
        assert opt.name == key.param and opt.required == key.required, key.name
        want = key.describe(command, flags)
        assert opt.help == (want if command != "run" else f"Override the recipe's {key.name}. {want}"), key.name
        if key.allowed():
            assert tuple(opt.type.choices) == key.allowed(), key.name
        assert opt.is_flag == (key.kind in ("flag", "gate")), key.name
        if key.default is not None:
            assert opt.default == key.default and opt.show_default, key.name
    table_flags = {k.flag for k in KEYS if k.flag}
    fields = {f.flag for f, _ in recipe_flags._fields(command == "project").values()} if command != "run" else set()
    others = {"--force", "--dry-run", "--json", "--modules", "--workspace", "--debug", "--quiet", "--device",
              "--weights", "--config", "--help"}  # --config: a mergekit file (merge) instead of the flags
    assert set(opts) - table_flags - fields - others == set()  # nothing typed by hand besides these


@pytest.mark.parametrize("args, flag_msg", [
    (["merge", "v28", "v51", "--method", "svd", "--out", "o"], "--method svd: needs --rank (e.g. --rank 32"),
    (["merge", "v28", "v51", "--method", "ties", "--density", "1.5", "--space", "core"],
     "--density 1.5: between 0 and 1"),
    (["merge", "v28", "v51", "--method", "slerp", "--t", "0.5", "--weights", "0.5,0.5"],
     "--method slerp: takes t, not weights; drop the --weights"),
    (["merge", "v28", "v51", "--method", "linear", "--t", "0.5"], "--t: only meaningful with method slerp"),
    (["refactor", "v54 +", "--out", "o"], "EXPRESSION: cannot parse expression"),
    (["project", "--base", "v54", "--dir", "v51-v28", "--trust", "0.01"],
     "--out: missing (where to write the adapter), or use --dry-run"),
    (["project", "--base", "v54", "--dir", "v51-v28", "--trust", "0.01", "--only", "nomatch", "--dry-run"],
     "--only 'nomatch': selects none of the 14 modules"),
    (["project", "--base", "v54", "--dir", "v51-v28", "--alpha", "0.1", "--dose", "1,1", "--out", "o"],
     "--dose [1.0, 1.0]: two multiples write the same folder (o-x1)"),
    (["project", "--base", "v54", "--dir", "v54 - v54", "--trust", "0.01", "--dry-run"],
     "--dir: the direction is zero in every module"),
])
def test_method_and_run_problems_name_the_flags_typed(toy, run_cli, args, flag_msg):
    """A method's own checks and the checks made while running (a selection, a dose ladder, a zero direction)
    are worded with the command's flags, as the recipe's own are."""
    res = run_cli(*args)
    assert res.exit_code == 2 and res.output.startswith("error: options: ") and flag_msg in res.output, res.output


@pytest.mark.parametrize("yaml, key_msg", [
    ("method: svd\nmodels: [v28, v51]\nout: o\n", "method=svd: needs rank (e.g. --rank 32"),
    ("method: slerp\nmodels: [v28, v51]\nt: 0.5\nout: o\n".replace("[v28, v51]", "[{model: v28, weight: 2}, v51]"),
     "method=slerp: takes t, not weights; drop the weights"),
    ("base: v54\ndir: v51-v28\ntrust: 0.01\nonly: nomatch\nout: o\n", "only='nomatch': selects none of the 14 modules"),
])
def test_the_same_problems_in_a_recipe_name_its_keys(toy, run_cli, yaml, key_msg):
    (toy / "r.yaml").write_text(yaml)
    res = run_cli("run", "r.yaml", "--dry-run")
    assert res.exit_code == 2 and key_msg in res.output and "--only" not in res.output, res.output


class _Plain(Method):
    """A method whose check returns plain text (the form before Problem): shown as written, in both."""

    name = "toy-plain"
    summary = "a test method"
    operands = ("base", "dir")
    stepped = True

    def validate(self, recipe):
        return ["mode=toy-plain: refuses every recipe (plain text)"]


def test_a_plain_text_problem_of_a_method_is_shown_as_written():
    """A method registered after the CLI was built is not a --mode choice; its recipe's problem is worded the same."""
    from vecmerge.errors import RecipeError
    from vecmerge.recipe.recipe import Recipe

    methods.register(_Plain)
    try:
        with pytest.raises(RecipeError) as e:
            Recipe.from_dict({"base": "v54", "dir": "v51-v28", "trust": 0.01, "mode": "toy-plain"})
    finally:
        methods.unregister("toy-plain")
    text = "mode=toy-plain: refuses every recipe (plain text)"
    assert e.value.problems == [text] and e.value.worded(recipe_flags.flag_words("project")).problems == [text]


def test_no_regular_expression_rewrites_a_recipe_problem():
    """Issue 22: the CLI renders the keys a problem names; it never searches the text for key names."""
    assert not hasattr(recipe_flags, "re") and not hasattr(recipe_flags, "as_flags")
