"""``vecmerge rank`` once its flags are parsed: candidates ranked by a calibrated proxy, or flagged; then the report."""

from __future__ import annotations

from ..errors import UsageError
from ..evidence.ledger.environment import EnvChoice
from ..evidence.ledger.ledger import Ledger
from ..io.safe_text import printable
from ..report import rank as report_rank
from ..report.format import to_json
from ..workspace.names import Workspace
from . import operations as evidence


def rank(ws: Workspace, candidates: list[str], proxies: list[str], target: str | None = None, *,
         min_models: int | None = None, env=(), as_json: bool = False, echo=print) -> dict:
    """``vecmerge rank CANDIDATES... --proxy P[,P2] [--target T]``: ``commands.operations.rank``.

    Args:
        ws (Workspace): the ledger and the candidates' current hashes. candidates (list[str]): names or folders.
        proxies (list[str]): ledger metrics. target (str | None): the metric to calibrate them against.
        min_models (int | None): past models needed before the proxy may rank (default 8).
        env (Iterable[str]): ``--env ID|KEY=VALUE`` options: the eval environment each metric is read in.
    """
    if len(set(candidates)) != len(candidates):
        raise UsageError(f"rank: name each candidate once (got {', '.join(candidates)})")
    ledger = Ledger(ws.ledger_path)
    options = {} if min_models is None else {"min_models": min_models}
    out = evidence.rank(ledger, candidates, proxies, target,
                        current_sha=ws.current_shas([*ledger.models(), *candidates]), env=EnvChoice.parse(env),
                        **options)
    echo(to_json(out) if as_json else printable(report_rank.render_rank(out), keep_newlines=True))
    return out
