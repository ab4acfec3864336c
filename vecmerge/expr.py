"""Expressions over adapters: ``v54 + 0.12*(v51 - v28)``, ``-v28``, ``2*(a-b)``, ``(a+b)/2``.

Everything vecmerge computes is linear in the adapters, so an expression reduces to a
``LinearForm``: ``{name: coefficient}``. ``a - a`` is exactly zero, and a name used twice is read once.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from .errors import ExpressionError

NAME_RE = r"[A-Za-z_][A-Za-z0-9_.]*"
_TOKEN = re.compile(rf"\s*(?:(?P<num>(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)|(?P<name>{NAME_RE})|(?P<op>[-+*/()]))")


@dataclass
class LinearForm:
    """``sum_i c_i * name_i`` plus, for pure numbers, a constant.

    Args:
        coeffs (dict[str, float]): adapter name -> coefficient, in order of first use.
        const (float | None): set only for a plain number.
    """

    coeffs: dict = field(default_factory=dict)
    const: float | None = None

    @property
    def is_number(self) -> bool:
        return self.const is not None and not self.coeffs

    @property
    def number(self) -> float:
        """The plain number this form is (``is_number``); 0.0 for a form that names adapters."""
        return 0.0 if self.const is None else self.const

    def scaled(self, c: float) -> LinearForm:
        if self.is_number:
            return LinearForm(const=self.number * c)
        return LinearForm({k: v * c for k, v in self.coeffs.items()})

    def names(self) -> list[str]:
        return list(self.coeffs)

    def __str__(self) -> str:
        if self.is_number:
            return repr(self.const)
        parts = []
        for k, c in self.coeffs.items():
            sign = "-" if c < 0 else "+"
            mag = abs(c)
            body = k if mag == 1.0 else f"{mag!r}*{k}"
            parts.append((sign, body))
        if not parts:
            return "0"
        text = ("-" if parts[0][0] == "-" else "") + parts[0][1]
        return text + "".join(f" {s} {b}" for s, b in parts[1:])


MAX_DEPTH = 64  # nested parentheses and signs: deeper is refused, never a RecursionError
MAX_CHARS = 10_000
_SHOWN = 70  # characters of the expression shown around the caret


def _fail(text: str, pos: int, why: str) -> ExpressionError:
    start = max(0, min(pos - _SHOWN // 2, len(text) - _SHOWN))
    shown = text[start:start + _SHOWN]
    pre, post = ("..." if start > 0 else ""), ("..." if start + _SHOWN < len(text) else "")
    return ExpressionError(f"cannot parse expression: {why} at column {pos + 1}\n  {pre}{shown}{post}\n"
                           f"  {' ' * (len(pre) + pos - start)}^")


def _path_at(text: str, pos: int) -> str | None:
    """The folder path written at ``pos`` (a run of name characters with a ``/`` in it), if any."""
    for m in re.finditer(r"[\w.~/-]*/[\w.~/-]*", text):
        if (m.start() <= pos < m.end() or pos == m.end()) and re.search(r"\w", m.group()):
            return m.group().strip("-")
    return None


def _path_error(text: str, pos: int) -> ExpressionError | None:
    """A path typed where a name belongs: say that names with ``/`` go in vecmerge.yaml."""
    path = _path_at(text, pos)
    if path is None:
        return None
    last = path.rstrip("/").rsplit("/", 1)[-1]
    name = last if re.fullmatch(NAME_RE, last) else "ck"
    return _fail(text, text.index(path), f"{path!r} is a folder path, and '/' divides; expressions take adapter "
                 f"names: name the folder in vecmerge.yaml (adapters: {{{name}: {path}}}) and write {name}")


class _Parser:
    def __init__(self, text: str):
        self.text = text
        self.tokens = []  # (kind, value, pos)
        pos = 0
        while pos < len(text):
            if text[pos:].strip() == "":
                break
            m = _TOKEN.match(text, pos)
            if m is None or m.end() == pos:
                bad = pos + (len(text[pos:]) - len(text[pos:].lstrip()))
                raise _path_error(text, bad) or _fail(text, bad, f"unexpected character {text[bad]!r}")
            kind = m.lastgroup or ""
            start = m.start(kind)
            self.tokens.append((kind, m.group(kind), start))
            pos = m.end()
        self.tokens.append(("end", "", len(text)))
        self.i = 0
        self.depth = 0

    def nest(self, pos: int) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise _fail(self.text, pos, f"nested deeper than {MAX_DEPTH} parentheses or signs; simplify it")

    def peek(self):
        return self.tokens[self.i]

    def take(self):
        tok = self.tokens[self.i]
        self.i += 1
        return tok

    def parse(self) -> LinearForm:
        if len(self.tokens) == 1:
            raise _fail(self.text, 0, "empty expression")
        form = self.expr()
        kind, val, pos = self.peek()
        if kind != "end":
            raise _fail(self.text, pos, f"unexpected {val!r}")
        if form.is_number:
            raise _fail(self.text, 0, "the expression names no adapter")
        if not all(math.isfinite(c) for c in form.coeffs.values()):
            raise _fail(self.text, 0, "a coefficient is out of range")
        return form

    def expr(self) -> LinearForm:
        left = self.term()
        while self.peek()[1] in ("+", "-") and self.peek()[0] == "op":
            _, op, pos = self.take()
            right = self.term()
            if left.is_number != right.is_number:
                raise _fail(self.text, pos, "cannot add a number to an adapter")
            if left.is_number:
                left = LinearForm(const=left.number + (right.number if op == "+" else -right.number))
                continue
            sign = 1.0 if op == "+" else -1.0
            coeffs = dict(left.coeffs)
            for k, c in right.coeffs.items():
                coeffs[k] = coeffs.get(k, 0.0) + sign * c
            left = LinearForm(coeffs)
        return left

    def term(self) -> LinearForm:
        left = self.unary()
        while self.peek()[0] == "op" and self.peek()[1] in ("*", "/"):
            _, op, pos = self.take()
            rpos = self.peek()[2]
            right = self.unary()
            if op == "/":
                if not right.is_number:
                    raise _path_error(self.text, pos) or _fail(self.text, rpos, "can only divide by a number")
                if right.number == 0:
                    raise _fail(self.text, rpos, "division by zero")
                left = left.scaled(1.0 / right.number)
            elif left.is_number:
                left = right.scaled(left.number)
            elif right.is_number:
                left = left.scaled(right.number)
            else:
                raise _fail(self.text, pos, "cannot multiply two adapters (the algebra is linear)")
        return left

    def unary(self) -> LinearForm:
        kind, val, pos = self.peek()
        if kind == "op" and val in ("+", "-"):
            self.take()
            self.nest(pos)
            inner = self.unary()
            self.depth -= 1
            return inner if val == "+" else inner.scaled(-1.0)
        return self.atom()

    def atom(self) -> LinearForm:
        kind, val, pos = self.take()
        if kind == "num":
            if not math.isfinite(float(val)):
                raise _fail(self.text, pos, f"number {val} is out of range")
            return LinearForm(const=float(val))
        if kind == "name":
            return LinearForm({val: 1.0})
        if kind == "op" and val == "(":
            self.nest(pos)
            inner = self.expr()
            k2, v2, p2 = self.take()
            if (k2, v2) != ("op", ")"):
                raise _fail(self.text, p2, "expected ')'")
            self.depth -= 1
            return inner
        if kind == "end":
            raise _path_error(self.text, pos - 1) or _fail(self.text, pos, "expression ends too early")
        raise (_path_error(self.text, pos) if val == "/" else None) or _fail(self.text, pos, f"unexpected {val!r}")


def parse(text: str) -> LinearForm:
    """Parse ``text`` to a ``LinearForm``; raises ExpressionError with a caret under the fault.

    Args:
        text (str): e.g. ``"v54 + 0.122591020054269*(v51 - v28)"``.
    """
    if not isinstance(text, str):
        raise ExpressionError(f"expected an expression string, got {type(text).__name__}")
    if len(text) > MAX_CHARS:
        raise ExpressionError(f"cannot parse expression: {len(text)} characters, more than {MAX_CHARS}; "
                              "name fewer adapters or define names in vecmerge.yaml")
    return _Parser(text).parse()
