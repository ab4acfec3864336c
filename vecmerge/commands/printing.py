"""What every command's report shares: JSON or the rendered text, paths shown short, the ledger of a workspace."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..evidence.ledger.ledger import Ledger
from ..io.safe_text import printable
from ..report.format import to_json
from ..workspace.names import Workspace

Echo = Callable[..., Any]


def ledger_of(ws: Workspace) -> Ledger:
    """The workspace's evidence ledger (``vecmerge-evidence.db`` beside ``vecmerge.yaml``, or its ``evidence:``)."""
    return Ledger(ws.ledger_path)


def say(echo: Echo, out: Any, render: Callable[[Any], str], as_json: bool) -> None:
    """``--json``: the dict (JSON escapes every control character); else the report, with escape sequences and
    control characters a stranger's names or notes may hold removed (``io.safe_text.printable``)."""
    echo(to_json(out) if as_json else printable(render(out), keep_newlines=True))


def show_path(path: str | Path) -> str:
    """A path relative to the current folder when it lies below it, else absolute."""
    p = Path(path)
    try:
        return str(p.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(p)
