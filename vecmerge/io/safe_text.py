"""Text that strangers wrote, made safe to show: on a terminal, and in a CSV file opened by a spreadsheet.

* ``printable(text)``: ANSI/VT escape sequences (CSI, OSC, two-character ESC, C1 CSI) removed whole, every other
  C0/C1 control and DEL removed; tab, CR and line breaks become one space (line breaks kept with
  ``keep_newlines``).
* ``spreadsheet_cell(text)``: OWASP's rule against CSV injection: a cell starting with ``=``, ``+``, ``-``,
  ``@``, a tab or a CR is prefixed with a single quote unless it reads as a plain number; a cell starting
  with a quote gets one more, so ``spreadsheet_text`` reads every cell back as it was.

Why not ``defusedcsv``, and examples: docs/design/io.md.
"""

from __future__ import annotations

import re

_ESCAPE = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]"            # CSI: ESC [ parameters intermediates final
    r"|\x9b[0-?]*[ -/]*[@-~]"             # CSI as one C1 character
    r"|[\x1b\x9d]\][^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"  # OSC ... BEL or ST (hyperlinks, titles)
    r"|\x1b[PX^_][^\x1b\x9c]*(?:\x1b\\|\x9c)?"  # DCS, SOS, PM, APC strings
    r"|\x1b[ -/]*[0-~]?"                   # any other ESC sequence (ESC c, ESC ( B, ...) or a lone ESC
)
_BREAKS = re.compile(r"\r\n|[\t\r\n\x0b\x0c\x85\u2028\u2029]")
_CONTROLS = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")
FORMULA_PREFIXES = ("=", "+", "-", "@", "\t", "\r")


def printable(text, *, keep_newlines: bool = False) -> str:
    """``text`` without escape sequences or control characters (module docstring); a line break, tab or CR
    becomes a space, or stays a line break with ``keep_newlines``. Non-strings are turned into text first.

    Args:
        text: what to show. keep_newlines (bool): keep ``\\n`` (a multi-line report); CR LF becomes ``\\n``.
    """
    text = _ESCAPE.sub("", str(text))
    if keep_newlines:
        text = text.replace("\r\n", "\n")
        return "\n".join(_CONTROLS.sub("", _BREAKS.sub(" ", line)) for line in text.split("\n"))
    return _CONTROLS.sub("", _BREAKS.sub(" ", text))


def spreadsheet_cell(text: str) -> str:
    """``text`` as a CSV cell a spreadsheet will not run: ``'`` before a leading ``= + - @``, tab or CR
    (unless the cell is a plain number) and before a leading ``'`` (so that the rule can be undone)."""
    if text.startswith("'") or (text.startswith(FORMULA_PREFIXES) and not _NUMBER.fullmatch(text)):
        return "'" + text
    return text


def spreadsheet_text(cell: str) -> str:
    """The inverse of ``spreadsheet_cell``: one leading ``'`` dropped where ``spreadsheet_cell`` would have put
    it (before ``'``, or before a formula prefix that is not a plain number); any other cell as it is."""
    if cell.startswith("'") and spreadsheet_cell(cell[1:]) == cell:
        return cell[1:]
    return cell
