"""Names and paths from the user or from files reach a terminal without escape sequences or control characters
(issue 23): a folder named with ``ESC[31m`` and an OSC title ``ESC]0;pwn BEL`` is shown stripped by every
report (``report.format.table`` and ``cli.app.echo``); ``--json`` keeps the name exact (JSON escapes it)."""

from __future__ import annotations

import json
import shutil

EVIL = "evil\x1b[31mred\x1b]0;pwn\x07\x7fX"


def clean(res, code: int | None = 0) -> str:
    assert code is None or res.exit_code == code, res.output
    assert not set(res.output) & {"\x1b", "\x07", "\x7f"}, repr(res.output)
    return res.output


def test_inspect_and_audit_strip_escapes_from_paths_and_names_read_from_files(toy, run_cli):
    shutil.copytree(toy / "v54", toy / EVIL)
    config = json.loads((toy / EVIL / "adapter_config.json").read_text())
    (toy / EVIL / "adapter_config.json").write_text(json.dumps({**config, "base_model_name_or_path": EVIL}))
    out = clean(run_cli("inspect", EVIL))
    assert "path                evilredX" in out and "base model          evilredX" in out
    assert "evilredX" in clean(run_cli("audit", EVIL, "v28"), code=2)  # refused by the expression parser: one line
    shown = json.loads(run_cli("inspect", EVIL, "--json").stdout)
    assert shown["path"].endswith(EVIL) and shown["base_model"] == EVIL  # JSON exact


def test_a_usage_error_line_holds_no_escape(run_cli):
    assert "No such option" in clean(run_cli("inspect", "--bogus\x1b[2J\x07X"), code=2)
