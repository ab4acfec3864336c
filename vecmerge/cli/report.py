"""``vecmerge report``: which candidate to submit, in one Markdown file and an HTML file beside it."""

from __future__ import annotations

from .. import requests as rq
from .app import main
from .generated import relay

relay(main, rq.Report, "report", "report")
