"""Text that strangers wrote, made safe to show: on a terminal, and in a CSV file opened by a spreadsheet.

Names, notes and metrics in the evidence ledger come from CSV files, lm-eval results and the command line,
so they may hold anything. Two rules, each one small function:

* ``printable(text)``: control and escape characters removed. An ANSI/VT escape sequence (``ESC [ ... m``,
  an OSC ``ESC ] ... BEL`` or ``ESC ] ... ESC \\``, a two-character ``ESC x``, a C1 ``CSI`` (0x9b) sequence) is
  removed whole, so ``\\x1b]8;;http://evil\\x07`` leaves nothing behind; every other C0 control, DEL and C1
  control is removed; a tab, CR or line break becomes one space (kept as a line break with
  ``keep_newlines``, for multi-line reports).
* ``spreadsheet_cell(text)``: OWASP's rule against CSV injection ("CSV Injection", owasp.org): a cell that
  starts with ``=``, ``+``, ``-``, ``@``, a tab or a CR is prefixed with a single quote, so a spreadsheet
  shows it as text instead of running it as a formula (``=HYPERLINK(...)``, ``@SUM(...)``); a cell that
  reads as a plain number (``-0.5``, ``+1e-3``) is left as it is. A cell that starts with a quote gets one
  more, so ``spreadsheet_text`` (reading such a file back) drops exactly one quote and every cell comes
  back as it was.

The maintained ``defusedcsv`` package applies the same prefix rule; these few lines avoid a dependency and
make the rule reversible for vecmerge's own re-import.
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
