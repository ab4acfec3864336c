"""The recipe keys for users, generated from the table (``keys.KEYS``) and the registered methods' fields.

``schema()`` is the list; ``recipe_help()`` prints it in ``vecmerge run --help``, ``recipe_markdown()``
is docs/RECIPES.md (``make readme`` writes it; a test keeps it current). This module imports no torch.
"""

from __future__ import annotations

import textwrap

from .. import methods
from .keys import KEYS

EXAMPLE = ("base: v54", "dir: v51 - v28", "trust: 0.0113", "consensus: {ref: v54 - v54e2, on_disagree: fail}",
           "out: out/v58")


def schema() -> list[tuple[str, str, str]]:
    """``[(key, values, meaning)]`` of every recipe key, the registered methods' own fields included."""
    rows = []
    for k in KEYS:
        name = k.name if k.alias_of is None else f"{k.name} (or {k.alias_of})"
        default = "" if k.default is None else f" Default {k.default}."
        rows.append((name, k.takes(), k.describe() + default))
    for name, owners in methods.all_fields().items():
        f = owners[0].fields[[x.name for x in owners[0].fields].index(name)]
        values = " | ".join(map(str, f.choices)) if f.choices else f.kind
        default = "" if f.default is None else f" Default {f.default}."
        rows.append((name, values, f"{f.help} (mode {', '.join(m.name for m in owners)}).{default}"))
    return rows


def recipe_help(width: int = 100) -> str:
    """The schema as plain text for ``vecmerge run --help`` (click keeps ``\\b`` blocks as they are)."""
    lines = ["Recipe keys (YAML; the flags of vecmerge project, merge and refactor build the same recipe):", "",
             "\b"]
    for key, values, meaning in schema():
        lines.append(f"  {key}: {values}")
        lines += textwrap.wrap(meaning, width, initial_indent="      ", subsequent_indent="      ")
    lines += ["", "\b", "Example (recipes/v58.yaml):", *(f"  {line}" for line in EXAMPLE)]
    return "\n".join(lines)


def recipe_markdown() -> str:
    """The schema as the markdown page docs/RECIPES.md (``make readme`` writes it; a test keeps it current)."""
    head = ["# Recipe keys", "",
            "Generated from the table of keys (`vecmerge/recipe/keys.py`) and the registered methods by `make "
            "readme`; `vecmerge run --help` prints the same. A recipe is a YAML mapping; the flags of `vecmerge "
            "project`, `vecmerge merge` and `vecmerge refactor` build the same recipe, and every output's "
            "`vecmerge.json` holds its recipe (`vecmerge run OUT/vecmerge.json` re-runs it).", "",
            "| key | values | meaning |", "|---|---|---|"]
    body = [f"| `{k}` | {v.replace('|', '&#124;')} | {m.replace('|', '&#124;')} |" for k, v, m in schema()]
    example = ["", "Example (`recipes/v58.yaml`):", "", "```yaml", *EXAMPLE, "```", ""]
    return "\n".join(head + body + example)
