"""``vecmerge verify``: an output re-derived and checked before it is uploaded."""

from __future__ import annotations

from .. import requests as rq
from .app import Ctx, echo, main
from .generated import command


@command(main, rq.Verify, "verify")
def verify(obj: Ctx, req: rq.Verify) -> None:
    from .. import commands

    commands.verify(obj.ws(), req, echo=echo, progress=obj.bars(), workspace_given=obj.workspace is not None)
