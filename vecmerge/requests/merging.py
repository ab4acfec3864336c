"""What a run of ``project``, ``merge``, ``refactor`` and ``run`` does besides its recipe: one request.

The recipe itself is declared by the table of recipe keys (``recipe/keys.py``), which makes those flags.
"""

from __future__ import annotations

from dataclasses import dataclass

from .shared import JSON
from .spec import Request, Spec, option


@dataclass(frozen=True)
class RunFlags(Request):
    """Replace outputs, only plan, print JSON, show the per-module table."""

    force: bool = option(Spec("--force", "Replace an existing --out.", kind="flag"))
    dry_run: bool = option(Spec("--dry-run", "Print the plan and report; write nothing.", kind="flag"))
    as_json: bool = option(JSON, help="Machine-readable report.")
    show_modules: bool = option(Spec("--modules", "Also print the per-module table.", kind="flag"))
