"""Commands generated from requests: each click parameter is one request field, with its default; problems of
several flags are one error line."""

from __future__ import annotations

import dataclasses

import click
import pytest

from vecmerge.cli import main
from vecmerge.requests import Request
from vecmerge.requests.spec import spec_of

GLOBAL = {"workspace", "debug", "quiet", "device"}


def _generated():
    commands = [*main.commands.values(), *main.commands["evidence"].commands.values()]
    by_doc = {cls.__doc__: cls for cls in Request.__subclasses__()}
    return [(c, by_doc[c.help]) for c in commands if isinstance(c, click.Command) and c.help in by_doc]


def test_twenty_commands_are_generated_from_their_requests():
    """Every command but the four whose flags build a recipe (``recipe/keys.py``) and the evidence group."""
    assert len(_generated()) == 20


@pytest.mark.parametrize(("command", "request_type"), _generated(), ids=lambda x: getattr(x, "name", ""))
def test_each_parameter_is_one_field_in_order_with_its_default(command, request_type):
    params = [p for p in command.params if p.name not in GLOBAL and p.name != "help"]
    fields = dataclasses.fields(request_type)
    assert [p.name for p in params] == [f.name for f in fields]
    for p, f in zip(params, fields):
        s = spec_of(f)
        assert isinstance(p, click.Argument) == (s.flag is None), f.name
        assert p.required == s.required, f.name
        if not s.required:  # what click gives when the flag is left out is the request's own default
            given = None if p.default is None or type(p.default).__name__ == "Sentinel" else p.default
            if given is None and (p.multiple or p.nargs == -1):
                given = ()
            if given is None and getattr(p, "is_flag", False) and not p.secondary_opts:
                given = False  # a lone flag left out is False
            assert given == f.default, f.name


def test_problems_of_several_flags_are_one_error_line(run_cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = run_cli("evidence", "plan", "v51", "--vs", "v51", "--min-effect", "-1", "--max-runs", "1",
                  "--beta", "1")
    assert res.exit_code == 2 and res.stdout == ""
    assert res.stderr == ("error: --min-effect -1.0: a difference > 0; --max-runs 1: at least 2 (a look needs two "
                          "runs of each model), at most 100000; --beta 1.0: in [0, 1), e.g. 0.1 (0: no futility "
                          "stop); evidence plan: A and --vs are both v51\n")
    assert not (tmp_path / "vecmerge-evidence.db").exists()
