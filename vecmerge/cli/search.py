"""``vecmerge search``: candidates that raise the target's loglik and keep every protected set, found and written."""

from __future__ import annotations

from .. import requests as rq
from .app import Ctx, echo, main
from .generated import command


@command(main, rq.Search, "search")
def search(obj: Ctx, req: rq.Search) -> None:
    from .. import commands

    commands.search(obj.ws(), req, echo=echo, progress=obj.bars())
