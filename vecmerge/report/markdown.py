"""``vecmerge report`` as Markdown: the blocks of ``report.candidates`` (its figures live in the HTML beside it)."""

from __future__ import annotations

from ..io.safe_text import printable
from ..outputs.policy import REPORT_MARK
from .candidates import blocks

__all__ = ["render_report", "cell"]


def cell(text) -> str:
    """Text safe in a Markdown table cell and line: printable, one line, ``|`` escaped, ``<`` as ``&lt;`` (no raw
    HTML from a stranger's name reaches a Markdown viewer)."""
    return (printable(str(text)).replace("\\", "\\\\").replace("|", "\\|").replace("<", "&lt;")
            .replace("\n", " "))


def render_report(d: dict, html_name: str) -> str:
    """The report (``commands.report.gather``'s dict) as Markdown; ``html_name``: the HTML file beside it.

    Args:
        d (dict): the gathered report. html_name (str): named where a figure would go.
    """
    lines = [REPORT_MARK]
    for b in blocks(d):
        kind = b[0]
        if kind == "h":
            lines += ["", "#" * b[1] + " " + cell(b[2])]
        elif kind == "p":
            lines += ["", cell(b[1])]
        elif kind == "ul":
            lines += [""] + [f"- {cell(x)}" for x in b[1]]
        elif kind == "table":
            lines += ["", "| " + " | ".join(cell(h) for h in b[1]) + " |", "|" + " --- |" * len(b[1])]
            lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in b[2]]
        elif kind == "fig":
            lines += ["", f"Figure ({b[1]}): {cell(b[2])} See [{html_name}]({html_name})."]
    return "\n".join(lines) + "\n"
