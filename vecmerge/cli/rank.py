"""``vecmerge rank``: new candidates ranked by a proxy that passed a held-out calibration, else flagged."""

from __future__ import annotations

from .. import requests as rq
from .app import Ctx, echo, main
from .generated import command


@command(main, rq.Rank, "rank")
def rank(obj: Ctx, req: rq.Rank) -> None:
    from .. import commands

    commands.rank(obj.ws(), req, echo=echo)
