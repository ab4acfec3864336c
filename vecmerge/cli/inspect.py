"""``vecmerge inspect`` and ``vecmerge audit``: what adapters are, and how trajectories agree."""

from __future__ import annotations

from .. import requests as rq
from .app import Ctx, echo, main
from .generated import command


@command(main, rq.Inspect, "inspect")
def inspect(obj: Ctx, req: rq.Inspect) -> None:
    from .. import commands

    commands.inspect(obj.ws(), req, echo=echo, progress=obj.bars())


@command(main, rq.Audit, "audit")
def audit(obj: Ctx, req: rq.Audit) -> None:
    from .. import commands

    commands.audit(obj.ws(), req, echo=echo, progress=obj.bars())
