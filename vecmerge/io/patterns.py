"""PEFT's ``rank_pattern``/``alpha_pattern`` regex keys, validated and matched without hanging.

PEFT resolves a module's rank and alpha with the first key ``k`` for which ``re.match(rf"(.*\\.)?({k})$",
name)`` holds; Python's ``re`` backtracks and has no timeout. Two guards, in this order:

1. a static check of the parsed pattern refuses a variable repeat (``*``, ``+``, ``{m,n}``) whose body holds
   another variable repeat or an alternation, and more than :data:`MAX_REPEATS` variable repeats in a row (a
   fixed count ``{k}`` multiplies what its body holds; ``?`` adds nothing);
2. a time budget: each match runs under a ``SIGALRM`` timer stopping it within milliseconds of
   :data:`MATCH_BUDGET_S`, or, where no timer can be used, in a child process killed after the budget.

Ordinary keys pass the check and match in microseconds. Why both guards: docs/design/io.md.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading
from contextlib import contextmanager

from .parse import ParseError, short

try:  # Python 3.11+
    from re import _constants as _sre_constants  # type: ignore[attr-defined]
    from re import _parser as _sre_parse  # type: ignore[attr-defined]
except ImportError:  # Python 3.10
    import sre_constants as _sre_constants
    import sre_parse as _sre_parse

MAX_KEY_CHARS = 1000
MAX_REPEATS = 4
MAX_COUNT = 100  # a {m,n} repeat with n above this counts as unbounded
MATCH_BUDGET_S = 1.0

_C = _sre_constants
_REPEATS = {_C.MAX_REPEAT, _C.MIN_REPEAT} | ({_C.POSSESSIVE_REPEAT} if hasattr(_C, "POSSESSIVE_REPEAT") else set())


class PatternError(ParseError):
    """A ``rank_pattern``/``alpha_pattern`` key that is not a valid, safe regex (exit 2)."""


def peft_regex(key: str) -> str:
    """The full regex PEFT matches a module name against: ``(.*\\.)?(KEY)$``."""
    return rf"(.*\.)?({key})$"


def check_pattern(key, *, field: str = "rank_pattern", source="adapter_config.json") -> None:
    """Refuse a key that is not a string, not a valid regex, or shaped to backtrack catastrophically.

    Args:
        key: the ``rank_pattern``/``alpha_pattern`` key. field (str): which mapping it is in.
        source (str | Path): the config file, for the message.
    """
    check_regex(key, what=f"{field} key {short(key)}", source=source, wrap=peft_regex)


def check_regex(regex, *, what: str, source, wrap=lambda r: r) -> re.Pattern:
    """The compiled ``wrap(regex)``, or PatternError if it is not a string, not valid, or unsafe (see above).

    Args:
        regex: the pattern as written in the file. what (str): names it in messages (``target_modules``).
        source (str | Path): the file. wrap (Callable[[str], str]): the full regex the pattern is used in.
    """
    if not isinstance(regex, str):
        raise PatternError(source, f"{what}: must be a string (a regex of module names)")
    if len(regex) > MAX_KEY_CHARS:
        raise PatternError(source, f"{what}: longer than {MAX_KEY_CHARS} characters; use a shorter pattern")
    try:
        tree = _sre_parse.parse(wrap(regex))
        compiled = re.compile(wrap(regex))
    except re.error as e:
        raise PatternError(source, f"{what}: not a valid regex ({e.msg}); escape special characters "
                                   r"such as '(' as '\(' or fix the pattern") from None
    except (RecursionError, OverflowError):
        raise PatternError(source, f"{what}: nested too deeply to use; simplify the pattern") from None
    try:
        repeats = _repeats(tree.data if hasattr(tree, "data") else list(tree))
    except _Unsafe as e:
        raise PatternError(source, f"{what}: {e} can take minutes to match a module name; write the pattern "
                                   "without it (plain module names are enough)") from None
    own = _repeats(_sre_parse.parse(wrap("")).data) if wrap("") else 0  # PEFT's own (.*\.)? prefix
    if repeats - own > MAX_REPEATS:
        raise PatternError(source, f"{what}: {repeats - own} variable repeats (*, +, {{m,n}}) in a row can take "
                                   f"minutes to match a module name; use at most {MAX_REPEATS}")
    return compiled


class _Unsafe(Exception):
    pass


def _repeats(items) -> int:
    """How many variable repeats a match of ``items`` may combine (the degree of its backtracking cost)."""
    total = 0
    for op, av in items:
        if op in _REPEATS:
            lo, hi, body = av
            inner = _repeats(body)
            if hi is _C.MAXREPEAT or hi > MAX_COUNT or (hi > 1 and lo != hi):
                if inner:
                    raise _Unsafe("a repeat inside a repeat (such as (a+)+ or (.*)*)")
                if _has_branch(body):
                    raise _Unsafe("a repeated alternation (such as (a|aa)*)")
                total += 1
            else:  # {k} repeats its body k times; ? (0..1) adds a choice, not a degree
                total += inner * max(hi, 1)
        elif op is _C.SUBPATTERN:
            total += _repeats(av[-1])
        elif op is _C.BRANCH:
            total += max(_repeats(b) for b in av[1])
        elif op in (_C.ASSERT, _C.ASSERT_NOT):
            total += _repeats(av[1])
        elif op is getattr(_C, "ATOMIC_GROUP", None):
            total += _repeats(av)
        elif op is _C.GROUPREF_EXISTS:
            total += max(_repeats(av[1]), _repeats(av[2]) if av[2] else 0)
    return total


def _has_branch(items) -> bool:
    for op, av in items:
        if op is _C.BRANCH:
            return True
        if op is _C.SUBPATTERN and _has_branch(av[-1]):
            return True
        if op in _REPEATS and _has_branch(av[2]):
            return True
    return False


class PatternSet:
    """The keys of one ``rank_pattern`` or ``alpha_pattern``, checked once, matched with PEFT's rule.

    Args:
        keys (Iterable[str]): the mapping's keys, in file order (PEFT takes the first match).
        field (str): ``rank_pattern`` or ``alpha_pattern``. source (str | Path): the config file.
        budget_s (float): the longest one module name may take to match, all keys together.
    """

    def __init__(self, keys, *, field: str = "rank_pattern", source="adapter_config.json",
                 budget_s: float = MATCH_BUDGET_S):
        self.keys = list(keys)
        self.field, self.source, self.budget_s = field, source, budget_s
        self._compiled = [check_regex(k, what=f"{field} key {short(k)}", source=source, wrap=peft_regex)
                          for k in self.keys]
        self._cache: dict[str, str | None] = {}

    def first_key(self, name: str) -> str | None:
        """The first key whose PEFT regex ``(.*\\.)?(KEY)$`` matches ``name``; None if none does."""
        if name not in self._cache:
            i = first_match(self._compiled, name, full=False, budget_s=self.budget_s,
                            what=lambda i: f"{self.field} key {short(self.keys[i])}", source=self.source)
            self._cache[name] = None if i is None else self.keys[i]
        return self._cache[name]


def pattern_matches(key: str, name: str, *, field: str = "rank_pattern", source="adapter_config.json") -> bool:
    """PEFT's rule ``re.match(rf"(.*\\.)?({key})$", name)``, after :func:`check_pattern`, under a time budget.

    Args:
        key (str): a ``rank_pattern``/``alpha_pattern`` key. name (str): a module name.
        field (str), source (str | Path): for messages.
    """
    return PatternSet([key], field=field, source=source).first_key(name) is not None


def first_match(regexes: list, name: str, *, full: bool, what, source, budget_s: float = MATCH_BUDGET_S):
    """The index of the first regex that matches ``name`` (``re.fullmatch`` if ``full``, else ``re.match``),
    or None; PatternError if matching takes over ``budget_s`` seconds in all. Check the regexes first
    (:func:`check_regex`): this is the backstop.

    Args:
        regexes (list[re.Pattern]): compiled regexes. name (str): a module name. full (bool): fullmatch or match.
        what (Callable[[int], str]): names regex i in messages. source (str | Path): the file.
    """
    if not regexes:
        return None
    current = [0]
    try:
        with _alarm(budget_s) as armed:
            if not armed:
                return _first_match_in_child(regexes, name, full, budget_s, current)
            for i, rx in enumerate(regexes):
                current[0] = i
                if (rx.fullmatch if full else rx.match)(name):
                    return i
            return None
    except _Timeout:
        raise PatternError(source, f"{what(current[0])}: matching module {short(name, 60)} took over "
                                   f"{budget_s:g} s (the regex backtracks); simplify the pattern") from None


class _Timeout(BaseException):
    pass


def _raise_timeout(signum, frame):
    raise _Timeout


@contextmanager
def _alarm(seconds: float):
    """Raise ``_Timeout`` in this block after ``seconds``; yields False where no timer can be armed."""
    usable = (hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()
              and signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0))
    if not usable:
        yield False
        return
    previous = signal.signal(signal.SIGALRM, _raise_timeout)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield True
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


_CHILD = """
import json, re, sys
job = json.load(sys.stdin)
match = re.fullmatch if job["full"] else re.match
for i, rx in enumerate(job["regexes"]):
    print(i, flush=True)
    if match(rx, job["name"]):
        print("match", i, flush=True)
        break
print("done", flush=True)
"""


def _first_match_in_child(regexes: list, name: str, full: bool, budget_s: float, current: list) -> int | None:
    """``first_match`` in a child Python process killed after ``budget_s`` (no timer usable here)."""
    try:
        done = subprocess.run([sys.executable, "-I", "-S", "-c", _CHILD], input=json.dumps(
            {"regexes": [r.pattern for r in regexes], "name": name, "full": full}), capture_output=True, text=True,
            timeout=budget_s + 0.5)
        lines = done.stdout.split()
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        tried = [int(t) for t in out.split() if t.isdigit()]
        current[0] = tried[-1] if tried else 0
        raise _Timeout from None
    if "match" in lines:
        return int(lines[lines.index("match") + 1])
    return None
