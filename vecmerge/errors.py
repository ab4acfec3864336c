"""Error types. Every message names the file, the module and the fix; the CLI prints it on one line.

Exit codes (see DESIGN.md section 4): ``VecmergeError.exit_code`` is 2 for bad input or usage,
1 for a check that ran and failed (verify, consensus gate, strict survival).
"""

from __future__ import annotations

from pathlib import Path


def few(items, n: int = 6, sep: str = ", ") -> str:
    """``"a, b, c and 4 more"``: a list shortened for a one-line message (never cut without saying so).

    Args:
        items (iterable): what to list. n (int): how many to show. sep (str): between them.
    """
    items = [str(x) for x in items]
    return sep.join(items[:n]) + (f" and {len(items) - n} more" if len(items) > n else "")


def shown(path) -> str:
    """A path as a report shows it: relative to the current folder when it lies inside it, else as given."""
    text = str(path)
    p = Path(text)
    if p.is_absolute():
        for here, there in ((Path.cwd(), p), (Path.cwd().resolve(), p.resolve())):
            try:
                return there.relative_to(here).as_posix() or "."
            except ValueError:
                continue
    return text


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


class ModelError(VecmergeError):
    """A model folder (or safetensors file) that cannot be read as transformers safetensors."""


class OutputError(VecmergeError):
    """An output folder that exists (without --force) or cannot be written."""


class MergeArgumentError(VecmergeError):
    """A merge kernel called with an argument outside its domain (density, weights, shapes, t)."""


class SVDInputError(VecmergeError):
    """A truncated SVD asked of something that is not a finite matrix, or with a bad rank/energy."""


class EvidenceError(VecmergeError):
    """Bad evidence input: a malformed record, file, direction, lineage or gate config (one line)."""


class LineageError(EvidenceError):
    """A parent map that loops back on itself (the message names the cycle)."""


class CheckFailed(VecmergeError):
    """A check that ran and did not pass (verify, consensus gate, --strict survival)."""

    exit_code = 1
