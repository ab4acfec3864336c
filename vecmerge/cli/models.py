"""``vecmerge extract`` and ``vecmerge fuse``: whole models in and out."""

from __future__ import annotations

from .. import requests as rq
from .app import Ctx, echo, main
from .generated import command


@command(main, rq.Extract, "extract")
def extract(obj: Ctx, req: rq.Extract) -> None:
    from .. import commands

    commands.extract(req, echo=echo, progress=obj.bars(), ws=obj.ws())


@command(main, rq.Fuse, "fuse")
def fuse(obj: Ctx, req: rq.Fuse) -> None:
    from .. import commands

    commands.fuse(obj.ws(), req, echo=echo, progress=obj.bars())
