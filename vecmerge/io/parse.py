"""Reading text that strangers wrote: YAML recipes and workspaces, JSON configs and manifests, paths.

Every reader is bounded and turns bad input into one :class:`ParseError` line naming the file and line,
echoing at most :data:`ECHO_CHARS` characters of the bad value. Limits (module constants, keyword arguments):

* YAML: :data:`YAML_MAX_BYTES` bytes, :data:`MAX_DEPTH` levels; anchors and aliases refused (no alias bomb);
  a key given twice refused.
* JSON: :data:`JSON_MAX_BYTES` bytes, :data:`MAX_DEPTH` levels; ``NaN``/``Infinity``, overflowing numbers,
  integers over :data:`MAX_INT_DIGITS` digits and duplicate keys refused.
* Text must be UTF-8 (a leading BOM is accepted); a path must not hold NUL or other control characters.

PEFT's regex keys are checked in :mod:`vecmerge.io.patterns`.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import yaml

from ..errors import VecmergeError
from .files import open_regular

YAML_MAX_BYTES = 1 << 20
JSON_MAX_BYTES = 64 << 20
MAX_DEPTH = 64
MAX_INT_DIGITS = 20
MAX_PATH_CHARS = 4096
ECHO_CHARS = 80


class ParseError(VecmergeError):
    """A file (or value) that cannot be read safely; ``str(err)`` is ``"FILE:LINE: problem; fix"``.

    Args:
        source (str): the file name (or a description such as ``"--ref"``).
        problem (str): what is wrong and how to fix it, one line.
        line (int | None): 1-based line number, when known.
    """

    def __init__(self, source, problem: str, line: int | None = None):
        self.source, self.problem, self.line = str(source), problem, line
        where = f"{self.source}:{line}" if line is not None else self.source
        super().__init__(f"{where}: {problem}")


def short(value, n: int = ECHO_CHARS) -> str:
    """``repr(value)`` cut to ``n`` characters (``'aaaa...' (12345 chars)``), for one-line messages."""
    text = value if isinstance(value, str) else None
    r = repr(value) if text is None or len(text) <= n else repr(text[:n]) + f"... ({len(text)} chars)"
    return r if len(r) <= n + 40 else r[:n] + f"... ({len(r)} chars)"


def read_text(path, *, max_bytes: int) -> str:
    """The UTF-8 text of ``path``: refuses a missing or oversized file and bytes that are not UTF-8.

    Args:
        path (str | Path): the file. max_bytes (int): refuse a larger file without reading it all.
    """
    return decode_utf8(read_bytes(path, max_bytes=max_bytes), path)


def read_bytes(path, *, max_bytes: int) -> bytes:
    """The bytes of ``path`` (for a caller that hashes what it parses): refuses a missing or oversized file.

    Args:
        path (str | Path): the file. max_bytes (int): refuse a larger file without reading it all.
    """
    path = Path(path)
    try:
        with open_regular(path) as f:
            data = f.read(max_bytes + 1)
    except FileNotFoundError:
        raise ParseError(path, "no such file; check the path") from None
    except IsADirectoryError:
        raise ParseError(path, "is a folder, expected a file; check the path") from None
    except OSError as e:
        raise ParseError(path, f"cannot read it ({e.strerror or e}); check the path and permissions") from None
    if len(data) > max_bytes:
        raise ParseError(path, f"larger than {max_bytes} bytes; this is not a file vecmerge wrote or expects")
    return data


def decode_utf8(data: bytes, source) -> str:
    """``data`` decoded as UTF-8 (a leading BOM dropped); one line naming the bad byte otherwise."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise ParseError(source, f"not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start}); "
                                 "save the file as UTF-8", line) from None


# ----------------------------------------------------------------------------------------------- YAML
class StrictLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` without anchors or aliases, with a nesting bound and no duplicate keys.

    Refusing aliases (rather than bounding their expansion) is the simple sound rule: vecmerge's files
    never need them, and a bound on expansion still lets a small file build a huge object graph.
    """

    max_depth = MAX_DEPTH

    def __init__(self, stream):
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent, index):
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            kind = "alias (*" if isinstance(event, yaml.AliasEvent) else "anchor (&"
            raise _YamlRefused(f"{kind}{short(event.anchor, 40)[1:-1]}) is not allowed; write the value out "
                               "in full", event.start_mark)
        self._depth += 1
        if self._depth > self.max_depth:
            raise _YamlRefused(f"nested deeper than {self.max_depth} levels; flatten the file", event.start_mark)
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node, deep=False):
        seen: dict = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # '<<' merges; its keys may be overridden
                continue
            key = self.construct_object(key_node, deep=True) if isinstance(key_node, yaml.ScalarNode) else None
            try:
                if key in seen:
                    raise _YamlRefused(f"key {short(key, 40)} given twice (first on line {seen[key]}); "
                                       "keep one", key_node.start_mark)
                seen[key] = key_node.start_mark.line + 1
            except TypeError:  # an unhashable key: SafeConstructor reports it
                pass
        return super().construct_mapping(node, deep=deep)


class _YamlRefused(yaml.YAMLError):
    def __init__(self, problem: str, mark):
        self.problem, self.problem_mark = problem, mark


def parse_yaml(text: str, source, *, max_depth: int = MAX_DEPTH, max_chars: int = YAML_MAX_BYTES):
    """The data of one YAML document ``text`` read with :class:`StrictLoader`.

    Args:
        text (str): the document. source (str | Path): the file name for messages.
        max_depth (int): the deepest nesting accepted. max_chars (int): the longest text accepted.
    """
    if len(text) > max_chars:
        raise ParseError(source, f"longer than {max_chars} characters; this is not a file vecmerge expects")
    loader = None
    try:
        loader = StrictLoader(text)  # the reader checks for control characters here
        loader.max_depth = max_depth
        return loader.get_single_data()
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        if isinstance(e, yaml.reader.ReaderError):  # a control character: no mark, a position
            line = text.count("\n", 0, e.position) + 1
            problem = f"control character 0x{e.character:02x} is not allowed; remove it"
        elif not isinstance(e, _YamlRefused):
            problem = f"not valid YAML ({short(problem, ECHO_CHARS)[1:-1]}); fix the file"
        raise ParseError(source, problem, line) from None
    except RecursionError:  # only reachable with a very large max_depth
        raise ParseError(source, "nested too deeply to read; flatten the file") from None
    except ValueError as e:  # an integer of thousands of digits (Python's int_max_str_digits)
        mark = getattr(loader, "mark", None) if loader is not None else None
        raise ParseError(source, f"a number too long to read ({str(e).split(':')[0]}); write it with at most a few "
                         "dozen digits", mark.line + 1 if mark is not None else None) from None
    finally:
        if loader is not None:
            loader.dispose()


def load_yaml(path, *, max_bytes: int = YAML_MAX_BYTES, max_depth: int = MAX_DEPTH):
    """The data of the YAML file ``path`` (UTF-8, bounded, no aliases): see :func:`parse_yaml`.

    Args:
        path (str | Path): the file. max_bytes (int): refuse larger files. max_depth (int): nesting bound.
    """
    return parse_yaml(read_text(path, max_bytes=max_bytes), path, max_depth=max_depth, max_chars=max_bytes)


# ----------------------------------------------------------------------------------------------- JSON
class Written(float):
    """A float that keeps the text it was written as (``Written("0.1480").text == "0.1480"``): the decimals a
    value was written with are in its text, not in its repr (0.148)."""

    text: str

    def __new__(cls, text: str, value: float | None = None):
        obj = super().__new__(cls, float(text) if value is None else value)
        obj.text = str(text)
        return obj


def parse_json(text: str, source, *, max_depth: int = MAX_DEPTH, max_int_digits: int = MAX_INT_DIGITS,
               max_chars: int = JSON_MAX_BYTES, keep_text: bool = False):
    """The data of the JSON ``text``, refusing what Python's ``json`` accepts but strict JSON does not.

    Args:
        text (str): the document. source (str | Path): the file name for messages.
        max_depth (int): the deepest nesting accepted. max_int_digits (int): the longest integer accepted.
        max_chars (int): the longest text accepted.
        keep_text (bool): numbers with a fraction or exponent as ``Written`` (their text kept).
    """
    if len(text) > max_chars:
        raise ParseError(source, f"longer than {max_chars} characters; this is not a file vecmerge expects")
    def constant(name):
        raise ValueError(f"{name} is not a JSON number; write a finite number")

    def integer(s):
        if len(s.lstrip("-")) > max_int_digits:
            raise ValueError(f"an integer of {len(s.lstrip('-'))} digits; write a number of at most "
                             f"{max_int_digits} digits")
        return int(s)

    def real(s):
        x = float(s)
        if not math.isfinite(x):
            raise ValueError(f"{short(s, 40)} overflows to infinity; write a finite number")
        return Written(s, x) if keep_text else x

    def pairs(items):
        out = {}
        for k, v in items:
            if k in out:
                raise ValueError(f"key {short(k, 40)} given twice in one object; keep one")
            out[k] = v
        return out

    try:
        data = json.loads(text, parse_constant=constant, parse_int=integer, parse_float=real,
                          object_pairs_hook=pairs)
    except json.JSONDecodeError as e:
        raise ParseError(source, f"not valid JSON ({e.msg} at column {e.colno}); restore or fix the file",
                         e.lineno) from None
    except ValueError as e:  # from the hooks above; the scanner does not say where
        raise ParseError(source, str(e)) from None
    except RecursionError:
        raise ParseError(source, f"nested too deeply to read (more than {max_depth} levels); this is not "
                                 "a file vecmerge wrote or expects") from None
    if _depth(data) > max_depth:
        raise ParseError(source, f"nested deeper than {max_depth} levels; this is not a file vecmerge wrote "
                                 "or expects")
    return data


def load_json(path, *, max_bytes: int = JSON_MAX_BYTES, max_depth: int = MAX_DEPTH,
              max_int_digits: int = MAX_INT_DIGITS, keep_text: bool = False):
    """The data of the JSON file ``path`` (UTF-8, bounded, strict): see :func:`parse_json`.

    Args:
        path (str | Path): the file. max_bytes (int): refuse larger files.
        max_depth (int): nesting bound. max_int_digits (int): the longest integer accepted.
    """
    return parse_json(read_text(path, max_bytes=max_bytes), path, max_depth=max_depth,
                      max_int_digits=max_int_digits, max_chars=max_bytes, keep_text=keep_text)


def parse_jsonl(text: str, source, *, max_lines: int, max_depth: int = MAX_DEPTH,
                max_int_digits: int = MAX_INT_DIGITS) -> list[tuple[int, object]]:
    """``[(line number, value)]`` of a JSON Lines text: one strict JSON value per non-blank line.

    Each line is read by :func:`parse_json` (so the same bounds hold per line); blank lines are skipped. A bad
    line is a ParseError naming its line; more than ``max_lines`` values are refused.

    Args:
        text (str): the file's text. source (str | Path): the file name for messages.
        max_lines (int): the most values accepted. max_depth, max_int_digits: as for :func:`parse_json`.
    """
    out: list = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        if len(out) >= max_lines:
            raise ParseError(source, f"more than {max_lines} lines; split the file", number)
        try:
            out.append((number, parse_json(line, source, max_depth=max_depth, max_int_digits=max_int_digits)))
        except ParseError as e:
            raise ParseError(source, e.problem, number) from None
    return out


def _depth(data) -> int:
    """Nesting depth of lists/dicts (a scalar is 0), computed without recursion."""
    deepest, stack = 0, [(data, 1)]
    while stack:
        x, d = stack.pop()
        if isinstance(x, dict):
            x = list(x.values())
        if isinstance(x, list):
            deepest = max(deepest, d)
            stack.extend((v, d + 1) for v in x if isinstance(v, (dict, list)))
    return deepest


# ---------------------------------------------------------------------------------------------- paths
def safe_path(value, *, field: str, source) -> Path:
    """``value`` (a path written in a file or on the command line) as a Path, or one clear error.

    Refuses a non-string, an empty string, one longer than :data:`MAX_PATH_CHARS`, and NUL or other
    control characters (legal on Linux, but never meant, and a newline would break one-line messages).

    Args:
        value: the raw value. field (str): where it was given (``adapters.v54``). source: the file.
    """
    if not isinstance(value, str) or not value:
        raise ParseError(source, f"{field}: expected a path (a non-empty string), got {short(value)}")
    if len(value) > MAX_PATH_CHARS:
        raise ParseError(source, f"{field}: a path of {len(value)} characters; give a real folder")
    bad = next((c for c in value if ord(c) < 0x20 or ord(c) == 0x7F), None)
    if bad is not None:
        raise ParseError(source, f"{field}: the path {short(value)} holds control character 0x{ord(bad):02x}; "
                                 "remove it")
    return Path(value)
