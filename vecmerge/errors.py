"""Error types. Every message names the file, the module and the fix; the CLI prints it on one line.

Exit codes (see DESIGN.md section 4): ``VecmergeError.exit_code`` is 2 for bad input or usage,
1 for a check that ran and failed (verify, consensus gate, strict survival).
"""

from __future__ import annotations


def few(items, n: int = 6) -> str:
    """``"a, b, c and 4 more"``: a list shortened for a one-line message."""
    items = [str(x) for x in items]
    return ", ".join(items[:n]) + (f" and {len(items) - n} more" if len(items) > n else "")


class VecmergeError(Exception):
    """Base class: a problem the user can fix. ``str(err)`` is one line."""

    exit_code = 2


class UsageError(VecmergeError):
    """Flags or arguments that do not go together (e.g. ``--ref`` without ``--dir``)."""


class AdapterError(VecmergeError):
    """A PEFT adapter folder that cannot be read as plain LoRA (config, tensors, shapes)."""


class AlignmentError(VecmergeError):
    """Adapters that cannot be combined: different base shapes, missing modules, layout."""


class ExpressionError(VecmergeError):
    """An expression that does not parse, or names something that does not resolve."""


class WorkspaceError(VecmergeError):
    """A `vecmerge.yaml` workspace file that is missing, unparsable or malformed."""


class RecipeError(VecmergeError):
    """A recipe (YAML or flags) with one or more invalid keys; lists every problem at once."""

    def __init__(self, problems: list[str], source: str = "recipe"):
        self.problems = list(problems)
        self.source = source
        if len(self.problems) == 1:  # a single problem keeps its detail (an expression's caret lines)
            super().__init__(f"{source}: {self.problems[0]}")
        else:
            joined = "; ".join(q.splitlines()[0] for q in self.problems)
            super().__init__(f"{source}: {len(self.problems)} problems: {joined}")


class NumericError(VecmergeError):
    """A module whose numbers leave float64's safe range (overflow, underflow, NaN): never written silently."""


class OutputError(VecmergeError):
    """An output folder that exists (without --force) or cannot be written."""


class CheckFailed(VecmergeError):
    """A check that ran and did not pass (verify, consensus gate, --strict survival)."""

    exit_code = 1
