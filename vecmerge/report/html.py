"""``vecmerge report`` as one self-contained HTML file: the blocks of ``report.candidates``, figures inline as
base64 PNG (``data:image/png;base64,...``), every text escaped, no script and nothing fetched."""

from __future__ import annotations

import base64
import html

from ..io.safe_text import printable
from ..outputs.policy import REPORT_MARK
from .candidates import blocks

__all__ = ["render_report"]

STYLE = ("body{font-family:sans-serif;max-width:70em;margin:2em auto;padding:0 1em;line-height:1.4}"
         "table{border-collapse:collapse;margin:0.5em 0;font-size:0.9em}"
         "th,td{border:1px solid #bbb;padding:0.2em 0.5em;text-align:left;vertical-align:top}"
         "th{background:#eee}figure{margin:1em 0}img{max-width:100%}figcaption{font-size:0.9em;color:#444}")


def _e(text) -> str:
    return html.escape(printable(str(text)))


def render_report(d: dict, figures: dict[str, bytes]) -> str:
    """The report (``commands.report.gather``'s dict) as HTML, with ``figures`` (key -> PNG bytes) inline.

    Args:
        d (dict): the gathered report. figures (dict[str, bytes]): ``plots.report_figures(d)``.
    """
    body = []
    for b in blocks(d):
        kind = b[0]
        if kind == "h":
            body.append(f"<h{b[1]}>{_e(b[2])}</h{b[1]}>")
        elif kind == "p":
            body.append(f"<p>{_e(b[1])}</p>")
        elif kind == "ul":
            body.append("<ul>" + "".join(f"<li>{_e(x)}</li>" for x in b[1]) + "</ul>")
        elif kind == "table":
            head = "".join(f"<th>{_e(h)}</th>" for h in b[1])
            rows = "".join("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in row) + "</tr>" for row in b[2])
            body.append(f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>")
        elif kind == "fig" and b[1] in figures:
            data = base64.b64encode(figures[b[1]]).decode("ascii")
            body.append(f'<figure><img alt="{_e(b[1])}" src="data:image/png;base64,{data}">'
                        f"<figcaption>{_e(b[2])}</figcaption></figure>")
    title = _e(next(b[2] for b in blocks(d) if b[0] == "h"))
    return (f"<!DOCTYPE html>\n{REPORT_MARK}\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{title}</title>"
            f"<style>{STYLE}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")
