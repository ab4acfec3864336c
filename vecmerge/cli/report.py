"""``vecmerge report``: which candidate to submit, in one Markdown file and an HTML file beside it."""

from __future__ import annotations

from .. import requests as rq
from .app import Ctx, echo, main
from .generated import command


@command(main, rq.Report, "report")
def report(obj: Ctx, req: rq.Report) -> None:
    from .. import commands

    commands.report(obj.ws(), req, echo=echo)
