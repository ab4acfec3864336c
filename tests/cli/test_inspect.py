"""``cli/inspect``: inspect and audit's flags (issue 23: ``--json`` on every command that prints a table)."""

from __future__ import annotations

import json


def test_audit_takes_json_like_every_command_and_keeps_format_as_an_alias(toy, run_cli):
    ref = ("--ref", "v54 - v54e2", "--dir", "v51 - v28", "--samples", "0")
    res = run_cli("audit", *ref, "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout) == json.loads(run_cli("audit", *ref, "--format", "json").stdout)
    assert json.loads(run_cli("audit", *ref, "--json", "--format", "json").stdout)["kind"] == "audit"
    pair = json.loads(run_cli("audit", "v28", "v51", "v54", "--json").stdout)
    assert pair["kind"] == "pairwise" and pair["pairwise"]["labels"] == ["v28", "v51", "v54"]
    res = run_cli("audit", *ref, "--json", "--format", "csv")
    assert res.exit_code == 2 and "--json and --format csv ask for two formats" in res.stderr
    assert "--json" in run_cli("audit", "--help").output
