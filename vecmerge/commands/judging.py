"""``vecmerge evidence compare``, ``evidence calibrate`` (with ``--loo``) and ``rank``: models judged on the ledger.

Each reads every metric in ONE eval environment (``environment.one_environment`` refuses two, naming the fields
that differ). The ledger operations (``compare_models``, ``calibrate_metrics``, ``calibrate_loo_metrics``,
``rank_models``) return JSON-ready data: the result's ``to_dict()`` with the environments it used; the commands
take the workspace and the request, and print the report.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ..errors import UsageError
from ..evidence import EvidenceError
from ..evidence.judge.calibrate import calibrate_records
from ..evidence.judge.compare import compare_records
from ..evidence.judge.loo import calibrate_loo_records
from ..evidence.judge.ranking import rank_candidates
from ..evidence.judge.subscores import sub_keys
from ..evidence.ledger.environment import EnvChoice, one_environment, records_of_one_environment
from ..evidence.ledger.ledger import Ledger
from ..evidence.ledger.precision import of_metric
from ..evidence.ledger.precision import read as read_decimals
from ..evidence.stats.replicates import members
from ..evidence.stats.stats import runs_by_model
from ..report import evidence as report_evidence
from ..report import rank as report_rank
from ..requests import EvidenceCalibrate, EvidenceCompare, Rank
from ..workspace.names import Workspace
from .printing import Echo, ledger_of, say
from .summaries import check_known

__all__ = ["compare_models", "calibrate_metrics", "calibrate_loo_metrics", "rank_models", "evidence_compare",
           "evidence_calibrate", "rank"]


def _one_metric(ledger: Ledger, names: Sequence[str], metric: str | None, current_sha) -> str:
    if metric is not None:
        return metric
    shared: set[str] | None = None
    stale: set[str] | None = None
    for n in names:
        recs = ledger.records([n], current_sha=current_sha, include_stale=True)
        mine, old = {r.metric for r in recs if not r.stale}, {r.metric for r in recs}
        shared = mine if shared is None else shared & mine
        stale = old if stale is None else stale & old
    if shared is not None and len(shared) == 1:
        return next(iter(shared))
    if shared:
        raise EvidenceError(f"{' and '.join(names)} share metrics {', '.join(sorted(shared))}; name one with --metric")
    if stale:
        gone = [n for n in names if not any(not r.stale for r in ledger.records([n], current_sha=current_sha,
                                                                                 include_stale=True))]
        raise EvidenceError(f"the records of {' and '.join(gone or names)} are stale: they measured other weights "
                            f"than {'those names have' if len(gone) != 1 else 'it has'} now (sha256 changed); "
                            "record new runs, or compare the old ones with --stale")
    raise EvidenceError(f"{' and '.join(names)} share no metric; name one with --metric")


def compare_models(ledger: Ledger, a: str, b: str, metric: str | None = None, *,
                   current_sha: Mapping[str, str | None] | None = None, include_stale: bool = False,
                   confidence: float = 0.95, detect: float | None = None, min_runs: int = 2,
                   target: str | None = None, margin: float | None = None, env: EnvChoice | None = None,
                   replicates: Mapping[str, Sequence[str]] | None = None) -> dict:
    """``vecmerge evidence compare A B [--metric M] [--detect D] [--target K] [--margin M] [--env ID|K=V]``:
    ``compare.compare_records`` over the ledger, every sub-score included (``target``: the one being raised; ``margin``:
    for all), in ONE eval environment: A's and B's records (their replicates' too) must share one, or ``env``
    must pick it, else "not the same measurement" naming the fields that differ.

    The pooled noise is over every model's current runs of the metric in that environment. Returns
    ``Comparison.to_dict()``.
    """
    check_known(ledger, [a, b], metric)
    metric = _one_metric(ledger, [a, b], metric, current_sha)
    records, stale = _compared_records(ledger, members([a, b], replicates), metric, current_sha, include_stale)
    chosen, records = records_of_one_environment(records, members([a, b], replicates), env,
                                                 f"{a} and {b} on {metric}")
    stale = {n: stale.get(n, 0) for n in (a, b)} if not include_stale else {}
    gone = [n for n in (a, b) if stale.get(n) and not any(r.model == n for r in records)]
    if gone and len(gone) == len({a, b}):
        raise EvidenceError(f"every record of {' and '.join(gone)} on {metric} is stale: it measured other weights "
                            "than the name has now (sha256 changed); record new runs, or compare the old ones "
                            "with --stale")
    if target is not None and target not in (known := sub_keys(records, [a, b])):
        raise EvidenceError(f"--target {target}: {a} and {b} recorded no such sub-score of {metric}; known: "
                            f"{', '.join(known) or 'none'}")
    out = compare_records(a, b, records, metric=metric, higher_is_better=ledger.direction(metric),
                          confidence=confidence, detect=detect, min_runs=min_runs, target=target, margins=margin,
                          margin_source="--margin", replicates=replicates,
                          env=chosen.to_dict() if chosen else None,
                          decimals=of_metric(read_decimals(ledger, metric), metric)).to_dict()
    out["reasons"] += [f"{n}: its {stale[n]} record(s) on {metric} are stale (they measured other weights; --stale "
                       "shows them)" for n in gone]
    return out


def _compared_records(ledger: Ledger, wanted, metric: str, current_sha, include_stale: bool) -> tuple[list, dict]:
    """``(records, {model: stale records})`` a comparison reads, in id order: every record of the compared models
    and their replicates (``wanted``), and the other models' whole runs only (the pooled noise: their item-level
    records enter no statistic, and on an item-level ledger they are nearly all of it)."""
    wanted = set(wanted)
    mine = ledger.records(sorted(wanted), metric, current_sha=current_sha, include_stale=True)
    stale: dict[str, int] = {}
    for r in mine:
        if r.stale:
            stale[r.model] = stale.get(r.model, 0) + 1
    others = [r for r in ledger.records(metric=metric, current_sha=current_sha, include_stale=include_stale,
                                        level="run") if r.model not in wanted]
    mine = [r for r in mine if include_stale or not r.stale]
    return sorted(mine + others, key=lambda r: r.id), stale


def calibrate_metrics(ledger: Ledger, proxy: str, target: str, *,
                      current_sha: Mapping[str, str | None] | None = None, env: EnvChoice | None = None,
                      **options) -> dict:
    """``vecmerge evidence calibrate --proxy P --target T [--min-models N] [--env ID|K=V ...]``:
    ``Calibration.to_dict()`` with ``environments`` (proxy and target: the one environment each was measured
    under; several for one metric are refused, naming the fields: ``--env`` picks, an id per metric)."""
    check_known(ledger, [], proxy)
    check_known(ledger, [], target)
    records = ledger.records(current_sha=current_sha)
    used, chosen = [], {}
    for metric in (proxy, target):
        e, recs = one_environment([r for r in records if r.metric == metric], env, f"calibrate: {metric}")
        used += recs
        chosen[metric] = e.to_dict() if e else None
    out = calibrate_records(used, proxy, target, directions=ledger.directions(), **options).to_dict()
    return {**out, "environments": chosen}


def _one_environment_each(records, metrics, env, what: str) -> tuple[list, dict]:
    """The records of ``metrics``, each metric in its one eval environment (``environment.one_environment``), and
    ``{metric: that environment's dict}``."""
    used, chosen = [], {}
    for metric in metrics:
        e, recs = one_environment([r for r in records if r.metric == metric], env, f"{what}: {metric}")
        used += recs
        chosen[metric] = e.to_dict() if e else None
    return used, chosen


def calibrate_loo_metrics(ledger: Ledger, proxies: Sequence[str], target: str, *,
                          current_sha: Mapping[str, str | None] | None = None, env: EnvChoice | None = None,
                          **options) -> dict:
    """``vecmerge evidence calibrate --proxy P1[,P2...] --target T --loo [--env ...]``: ``Calibration.to_dict()``
    with ``environments`` (each metric in one eval environment, as ``calibrate_metrics``)."""
    for metric in (*proxies, target):
        check_known(ledger, [], metric)
    used, chosen = _one_environment_each(ledger.records(current_sha=current_sha), (*proxies, target), env, "calibrate")
    out = calibrate_loo_records(used, list(proxies), target, directions=ledger.directions(), **options).to_dict()
    return {**out, "environments": chosen}


def rank_models(ledger: Ledger, candidates: Sequence[str], proxies: Sequence[str], target: str | None = None, *,
         current_sha: Mapping[str, str | None] | None = None, env: EnvChoice | None = None, **options) -> dict:
    """``vecmerge rank CANDIDATES... --proxy P [--target T] [--env ...]``: ``ranking.rank_candidates`` over the ledger.

    Each candidate's value of a proxy is the mean of its current whole runs (``vecmerge probe`` writes one); with a
    target, the proxies are calibrated leave-one-model-out on the past models (the candidates left out) first. Each
    metric is read in one eval environment, as ``calibrate_metrics`` reads it.

    Returns:
        dict: ``Ranking.to_dict()`` with ``environments``.
    """
    metrics = (*proxies, *([target] if target else []))
    for metric in metrics:
        check_known(ledger, [], metric)
    records, chosen = _one_environment_each(ledger.records(current_sha=current_sha), metrics, env, "rank")
    means = {p: {m: sum(v) / len(v) for m, v in runs_by_model(r for r in records if r.metric == p).items()}
             for p in proxies}
    missing = [f"{c} ({p})" for p in proxies for c in candidates if c not in means[p]]
    if missing:
        raise EvidenceError(f"no current whole-run record of {', '.join(missing[:4])}"
                            f"{' and more' if len(missing) > 4 else ''} in {ledger.path}; record it first "
                            "(vecmerge probe CANDIDATE --prompts FILE, or evidence add)")
    values = {p: {c: means[p][c] for c in candidates} for p in proxies}
    history = {p: {m: v for m, v in means[p].items() if m not in values[p]} for p in proxies}
    calibration = None
    if target is not None:
        calibration = calibrate_loo_records(records, list(proxies), target, directions=ledger.directions(),
                                            exclude=candidates, **options)
    out = rank_candidates(values, history=history, calibration=calibration, directions=ledger.directions())
    return {**out.to_dict(), "environments": chosen}


def evidence_compare(ws: Workspace, req: EvidenceCompare, *, echo: Echo = print) -> dict:
    """``vecmerge evidence compare A B [--metric M] [--detect D] [--target K] [--margin M]``: Welch, paired and
    clustered tests, the verdict, and every sub-score with what the difference costs the others.

    The metric defaults to the workspace's ``metric:`` when A and B both have records of it. One eval environment
    (``--env ID`` or ``--env KEY=VALUE`` picks it when the records span several); replicate groups reported.
    """
    ledger = ledger_of(ws)
    current = ws.current_shas(ledger.models())
    metric = req.metric
    if metric is None and ws.metric is not None:
        shared = [{r.metric for r in ledger.records([n], current_sha=current)} for n in (req.a, req.b)]
        metric = ws.metric if all(ws.metric in m for m in shared) else None
    out = compare_models(ledger, req.a, req.b, metric, current_sha=current, include_stale=req.include_stale,
                         detect=req.detect, target=req.target, margin=req.margin, env=EnvChoice.parse(req.env),
                         replicates=ws.replicate_groups())
    say(echo, out, report_evidence.render_compare, req.as_json)
    return out


def evidence_calibrate(ws: Workspace, req: EvidenceCalibrate, *, echo: Echo = print) -> dict:
    """``vecmerge evidence calibrate --proxy P[,P2...] --target T [--loo] [--env ID|K=V ...]``: can P rank the models
    the way T does? Each metric in one eval environment; several proxies (combined by least squares) need
    ``--loo`` (held-out predictions, each model left out of its own fit: ``evidence.judge.loo``).
    """
    ledger = ledger_of(ws)
    proxies = list(req.proxy)
    options = {} if req.min_models is None else {"min_models": req.min_models}
    current = ws.current_shas(ledger.models())
    if req.loo:
        out = calibrate_loo_metrics(ledger, proxies, req.target, current_sha=current, env=EnvChoice.parse(req.env),
                                    **options)
        say(echo, out, report_rank.render_calibrate_loo, req.as_json)
        return out
    if len(proxies) != 1:
        raise UsageError(f"--proxy {','.join(proxies)}: several proxies are combined by a least-squares fit, which "
                         "only a held-out calibration can judge; add --loo")
    out = calibrate_metrics(ledger, proxies[0], req.target, current_sha=current, env=EnvChoice.parse(req.env),
                            **options)
    say(echo, out, report_evidence.render_calibrate, req.as_json)
    return out


def rank(ws: Workspace, req: Rank, *, echo: Echo = print) -> dict:
    """``vecmerge rank CANDIDATES... --proxy P[,P2] [--target T]``: ``rank_models`` over the workspace's ledger,
    the candidates' current hashes included; ``--env``: the eval environment each metric is read in."""
    ledger = ledger_of(ws)
    options = {} if req.min_models is None else {"min_models": req.min_models}
    candidates = list(req.candidates)
    out = rank_models(ledger, candidates, list(req.proxy), req.target,
                      current_sha=ws.current_shas([*ledger.models(), *candidates]), env=EnvChoice.parse(req.env),
                      **options)
    say(echo, out, report_rank.render_rank, req.as_json)
    return out
