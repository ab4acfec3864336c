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


class Problem:
    """One problem with a recipe, naming the keys it is about, so that it reads in recipe or in flag words.

    ``template`` is the message with every recipe key in braces: ``{dir}`` is the key (``dir`` in a recipe,
    ``--dir`` on the command line), ``{mode=}`` the key given the value written after it (``mode=onto-ref``,
    ``--mode onto-ref``), ``{trust:}`` a key in a YAML example (``trust: 0.0113``, ``--trust 0.0113``);
    ``{}`` is the next of ``values``, shown as it is (user text is never read as a template); ``{{`` and
    ``}}`` are braces. ``Problem("{mode=}onto-ref: needs {consensus.ref}")`` reads
    ``mode=onto-ref: needs consensus.ref`` in a recipe and ``--mode onto-ref: needs --consensus-ref``
    with the flags ``{"mode": "--mode", "consensus.ref": "--consensus-ref"}``.

    Args:
        template (str): the message, its keys in braces. *values: what the ``{}`` slots show, in order.
    """

    __slots__ = ("template", "values")

    def __init__(self, template: str, *values):
        self.template, self.values = template, tuple(str(v) for v in values)
        _parts(template, len(self.values))  # a malformed template fails where it is written

    @classmethod
    def about(cls, key: str, text: str, *values, given=None) -> Problem:
        """``key=GIVEN: text`` (``key: text`` when nothing is given); ``text`` is a template of its own.

        Args:
            key (str): the recipe key. text (str): what is wrong and the fix. given: the value, as shown.
        """
        head = ("{" + key + "=}{}: ", given) if given is not None else ("{" + key + "}: ",)
        return cls(head[0] + text, *head[1:], *values)

    @classmethod
    def led_by(cls, key: str, text: str) -> Problem:
        """A message of a lower layer that starts with ``key`` (``rank='big': ...``, ``out: ...``), that key
        marked; any other text is kept as it is (no key).

        Args:
            key (str): the key the caller knows the message is about. text (str): the message.
        """
        rest = text[len(key):]
        if not text.startswith(key) or rest[:1] not in ("=", ":", ".", "["):
            return cls("{}", text)
        return cls("{" + key + "=}{}", rest[1:]) if rest[0] == "=" else cls("{" + key + "}{}", rest)

    @property
    def keys(self) -> tuple[str, ...]:
        """The recipe keys the message names, in order, each once."""
        return tuple(dict.fromkeys(k for k, _ in _parts(self.template, len(self.values)) if k))

    def words(self, flags=None) -> str:
        """The message with each key spelled by ``flags`` (``{key: flag}``; a key it lacks keeps its name).

        Args:
            flags (Mapping[str, str] | None): e.g. ``{"dir": "--dir"}``; None: recipe words.
        """
        return in_words(self.template, self.values, flags)

    def __str__(self) -> str:
        return self.words()

    def __eq__(self, other) -> bool:
        return isinstance(other, Problem) and (self.template, self.values) == (other.template, other.values)

    def __hash__(self) -> int:
        return hash((self.template, self.values))

    def __repr__(self) -> str:
        return f"Problem({self.template!r}{''.join(', ' + repr(v) for v in self.values)})"


def in_words(template: str, values=(), flags=None) -> str:
    """``template`` (``Problem``'s syntax) with its ``{}`` slots filled by ``values`` and its keys spelled by
    ``flags``: the recipe's own names when None. Help texts that name keys read the same way.

    Args:
        template (str): text with keys in braces. values (Sequence[str]): the ``{}`` slots' text.
        flags (Mapping[str, str] | None): recipe key -> the word that sets it (a flag, or an argument's name).
    """
    flags, values, out = flags or {}, iter(values), []
    for key, form in _parts(template, None):
        if key is None:
            out.append(next(values) if form is None else form)
        elif key in flags:
            out.append(flags[key] + ("" if form == "" else " "))
        else:
            out.append(key + (form or ""))
    return "".join(out)


def _parts(template: str, n_values: int | None) -> list[tuple[str | None, str | None]]:
    """``[(key, form)]``: ``(None, text)`` literal text, ``(None, None)`` a value slot, ``(key, "" | "=" |
    ": ")`` a key; ValueError for unbalanced braces or a wrong number of values (a programming error)."""
    parts: list[tuple[str | None, str | None]] = []
    text: list[str] = []
    i = slots = 0
    while i < len(template):
        c = template[i]
        if c in "{}" and template[i + 1:i + 2] == c:
            text.append(c)
            i += 2
            continue
        if c == "}":
            raise ValueError(f"unbalanced '}}' at {i} in {template!r}")
        if c != "{":
            text.append(c)
            i += 1
            continue
        end = template.find("}", i)
        if end < 0:
            raise ValueError(f"unbalanced '{{' at {i} in {template!r}")
        if text:
            parts.append((None, "".join(text)))
            text = []
        slot = template[i + 1:end]
        if slot == "":
            parts.append((None, None))
            slots += 1
        elif slot[-1] in "=:":
            parts.append((slot[:-1], "=" if slot[-1] == "=" else ": "))
        else:
            parts.append((slot, ""))
        i = end + 1
    if text:
        parts.append((None, "".join(text)))
    if n_values is not None and slots != n_values:
        raise ValueError(f"{template!r} has {slots} value slot(s) for {n_values} value(s)")
    return parts


class RecipeError(VecmergeError):
    """A recipe (YAML or flags) with one or more invalid keys; lists every problem at once.

    Args:
        problems (list[str | Problem]): each problem; a Problem names its keys (``worded`` re-spells them).
        source (str): where the recipe came from (a file, ``options``, ``recipe``).

    ``problems`` holds them as text in recipe words; ``details`` as Problems (plain text: one without keys).
    """

    def __init__(self, problems: list, source: str = "recipe"):
        self.details = [q if isinstance(q, Problem) else Problem("{}", q) for q in problems]
        self.problems = [str(q) for q in self.details]
        self.source = source
        if len(self.problems) == 1:  # a single problem keeps its detail (an expression's caret lines)
            super().__init__(f"{source}: {self.problems[0]}")
        else:
            joined = "; ".join(q.splitlines()[0] for q in self.problems)
            super().__init__(f"{source}: {len(self.problems)} problems: {joined}")

    def worded(self, flags, source: str | None = None) -> RecipeError:
        """The same error with every key spelled by ``flags`` (the command line's words for them).

        Args:
            flags (Mapping[str, str]): recipe key -> flag or argument name, e.g. ``{"dir": "--dir"}``.
            source (str | None): where the recipe came from now (default: the same).
        """
        return RecipeError([q.words(flags) for q in self.details], self.source if source is None else source)


class NumericError(VecmergeError):
    """A module whose numbers leave float64's safe range (overflow, underflow, NaN): never written silently."""


class ModelError(VecmergeError):
    """A model folder (or safetensors file) that cannot be read as transformers safetensors."""


class SpecialFileError(VecmergeError):
    """A FIFO, device or socket where vecmerge reads a file: refused before it is opened (``io.files``)."""


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
