"""``vecmerge demo``: the whole story on toy trajectories it trains itself."""

from __future__ import annotations

import click

from .. import requests as rq
from .app import Ctx, main
from .generated import command


@command(main, rq.Demo, "demo")
def demo(obj: Ctx, req: rq.Demo) -> None:
    from ..demo.run import run_demo

    run_demo(req.out, force=req.force, small=req.small, quiet=obj.quiet, echo=click.echo)
