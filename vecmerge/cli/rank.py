"""``vecmerge rank``: new candidates ranked by a proxy that passed a held-out calibration, else flagged."""

from __future__ import annotations

import click

from .app import Ctx, echo, global_options, handled, json_option, main, metric_list, usage
from .evidence import env_option


@main.command()
@click.argument("candidates", nargs=-1, required=True)
@click.option("--proxy", required=True, help="The ledger metric(s) to rank by, e.g. probe:toy:loglik (P1,P2: a fit).")
@click.option("--target", help="The metric that matters; the proxy is calibrated against it on past models first.")
@click.option("--min-models", type=int, help="Past models needed before a proxy may rank (default 8).")
@env_option
@json_option
@global_options
@click.pass_obj
@handled
def rank(obj: Ctx, candidates, proxy, target, min_models, env, as_json):
    """Rank CANDIDATES (a dose ladder, merges) by PROXY, or say it is a disaster detector only.

    With --target, PROXY is calibrated leave-one-model-out against TARGET on the past models (the candidates
    left out); when that calibration ranks candidates, they are ranked by the predicted TARGET, beside its
    held-out accuracy. Otherwise they are listed unranked, and those far below the others are flagged.
    """
    proxies = metric_list(proxy, "--proxy")
    if target is not None and target in proxies:
        usage(f"rank: --target {target} is also a --proxy; rank by another metric")
    if min_models is not None and min_models < 3:
        usage(f"--min-models {min_models}: at least 3 (a rank correlation needs 3 models)")
    from .. import commands

    commands.rank(obj.ws(), list(candidates), proxies, target, min_models=min_models, env=env, as_json=as_json,
                  echo=echo)
