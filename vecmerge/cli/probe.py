"""``vecmerge probe``: checkpoints teacher-forced on a prompt file; function-space evidence into the ledger."""

from __future__ import annotations

from .. import requests as rq
from .app import Ctx, echo, main
from .generated import command


@command(main, rq.Probe, "probe")
def probe(obj: Ctx, req: rq.Probe) -> None:
    from .. import commands

    commands.probe(obj.ws(), req, echo=echo, progress=obj.bars())
