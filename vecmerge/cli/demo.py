"""``vecmerge demo``: the whole story on toy trajectories it trains itself."""

from __future__ import annotations

import click

from .app import Ctx, global_options, handled, main


@main.command()
@click.option("--out", type=click.Path(file_okay=False), default="demo-out", show_default=True,
              help="The demo folder (the toy checkpoints, vecmerge.yaml, the audit plot and out/v58).")
@click.option("--force", is_flag=True, help="Replace an existing --out (only one a demo made).")
@click.option("--small", is_flag=True, help="Smallest settings (for tests).")
@global_options
@click.pass_obj
@handled
def demo(obj: Ctx, out, force, small):
    """Train toy trajectories, then inspect, audit, project and verify: the whole story in a minute."""
    from ..demo.run import run_demo

    run_demo(out, force=force, small=small, quiet=obj.quiet, echo=click.echo)
