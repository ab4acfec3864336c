"""``vecmerge report``: which candidate to submit, in one Markdown file and an HTML file beside it."""

from __future__ import annotations

import click

from .app import Ctx, echo, global_options, handled, main
from .evidence import env_option


@main.command("report")
@click.argument("candidates", nargs=-1, required=True)
@click.option("--vs", "vs", required=True, help="The backbone every candidate is judged against.")
@click.option("--metric", help="The metric (default: metric: in vecmerge.yaml, or the one the models share).")
@click.option("--out", required=True, type=click.Path(dir_okay=False),
              help="The Markdown file (FILE.md); FILE.html, with the plots inline, is written beside it.")
@click.option("--force", is_flag=True, help="Replace a report this command wrote before (never another file).")
@env_option
@global_options
@click.pass_obj
@handled
def report(obj: Ctx, candidates, vs, metric, out, force, env):
    """Which of CANDIDATES to submit, judged against --vs on the ledger's records.

    Per candidate: the total with its interval against the backbone, every sub-score's non-inferiority row, the
    plan's state, the gate it passed (a vecmerge output's manifest), probes and their calibration; then a
    recommendation with its reasons. Both files are written or neither.
    """
    from .. import commands

    commands.report(obj.ws(), list(candidates), vs, out=out, metric=metric, force=force, env=env, echo=echo)
