"""``vecmerge report CANDIDATES... --vs BACKBONE [--metric M] --out FILE.md``: which candidate to submit, in one
Markdown file and an HTML file beside it (FILE.html, the plots inline).

Everything is read through the judging functions the evidence commands use (``compare_models`` with every
sub-score, the plan's ``decide``, ``calibrate_metrics``, ``show`` for probe means) and the gate a vecmerge
output recorded in its manifest; ``recommend`` turns their verdicts into advice. Both files are checked before
any work and written in one transaction: both or neither, an existing one replaced only with ``--force``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import EvidenceError, OutputError, UsageError
from ..evidence.ledger.environment import EnvChoice
from ..evidence.ledger.ledger import Ledger
from ..outputs.manifest import read_manifest
from ..outputs.policy import HTML_REPORT, MARKDOWN_REPORT
from ..outputs.transaction import OutputPolicy, OutputTransaction
from ..report import html as report_html
from ..report import markdown as report_markdown
from ..report import plots
from ..requests import Report
from ..workspace.names import Workspace
from .judging import calibrate_metrics, compare_models
from .plans import decide
from .printing import Echo, show_path
from .recommend import advise, noise_used, one_mcnemar, recommend
from .summaries import check_known, show

__all__ = ["report", "gather", "plan_state"]


def plan_state(ledger: Ledger, a: str, b: str, metric: str, current_sha, env: EnvChoice | None) -> dict | None:
    """The latest plan of A vs B on the metric and where it stands (``decide``), or None without a plan.

    The one place the report reads a plan: a plan that can no longer be judged (other weights) is reported
    with its reason, not fatal.
    """
    if not ledger.plans(a, b, metric):
        return None
    try:
        return decide(ledger, a, b, metric, current_sha=current_sha, env=env)
    except EvidenceError as e:
        return {"decision": None, "error": str(e)}


def _gate(ws: Workspace, name: str) -> dict | None:
    """The gate a vecmerge output of this name passed before it was written (its manifest's ``gate``), if any."""
    folder = ws.adapters.get(name)
    if folder is None or not Path(folder).is_dir():
        return None
    try:
        return read_manifest(folder).get("gate")
    except (OutputError, AttributeError):
        return None


def _probes(ledger: Ledger, names: list[str], metric: str, current, env: EnvChoice | None) -> list[dict]:
    """Each ``probe:*`` metric recorded for a candidate: the models' summaries (``show``) and its calibration
    against the metric (``calibrate_metrics``; the reason when it cannot be judged)."""
    out = []
    for proxy in [m for m in ledger.metrics() if m.startswith("probe:")]:
        shown = show(ledger, names, proxy, current_sha=current, env=env)
        summaries = [s for s in shown["summaries"] if s["sub"] is None]
        if not summaries:
            continue
        try:
            cal, why = calibrate_metrics(ledger, proxy, metric, current_sha=current, env=env), None
        except EvidenceError as e:
            cal, why = None, str(e)
        out.append({"metric": proxy, "summaries": summaries, "calibration": cal, "calibration_error": why})
    return out


def gather(ws: Workspace, candidates: list[str], vs: str, metric: str | None = None, env=()) -> dict:
    """Every figure the report shows, JSON-ready (``docs/REPORT.md`` lists the keys).

    Args:
        ws (Workspace): the ledger and the adapters. candidates (list[str]): the models to judge.
        vs (str): the backbone. metric (str | None): default the workspace's ``metric:``, else the one all share.
        env: ``--env ID|KEY=VALUE`` options (one eval environment).
    """
    if not candidates:
        raise UsageError("report: name at least one candidate, e.g. vecmerge report v58 v59 --vs v54 --out r.md")
    if vs in candidates or len(set(candidates)) != len(candidates):
        raise UsageError(f"report: candidates {' '.join(candidates)} --vs {vs}: name each model once, and the "
                         "backbone only after --vs")
    ledger = Ledger(ws.ledger_path)
    if not ledger.path.exists():
        raise EvidenceError(f"no ledger at {ledger.path}: record runs first (vecmerge evidence add / import)")
    choice = EnvChoice.parse(env)
    current = ws.current_shas(ledger.models())
    check_known(ledger, [*candidates, vs], metric)
    metric = metric or (ws.metric if ws.metric in ledger.metrics() else None)
    compare = lambda a, b: one_mcnemar(compare_models(  # noqa: E731
        ledger, a, b, metric, current_sha=current, env=choice, replicates=ws.replicate_groups()))
    rows: list[dict[str, Any]] = []
    for name in candidates:
        cmp = compare(name, vs)
        metric = cmp["metric"]
        missing = [n for n, s in ((name, cmp["a_summary"]), (vs, cmp["b_summary"])) if s is None]
        if missing:
            raise EvidenceError(f"no current record of {' and '.join(missing)} on {metric} in {ledger.path}; record "
                                "its runs, or leave it out")
        if cmp["higher_is_better"] is None:
            raise EvidenceError(f"{metric}: no direction recorded, so no candidate can be called better; declare it "
                                f"(vecmerge evidence import --higher-is-better {metric}, or evidence add ... "
                                "--higher-is-better)")
        plan = plan_state(ledger, name, vs, metric, current, choice)
        advice, reasons = advise(cmp, plan)
        rows.append({"name": name, "comparison": cmp, "plan": plan, "gate": _gate(ws, name), "advice": advice,
                     "reasons": reasons})
    higher = rows[0]["comparison"]["higher_is_better"]
    return {"backbone": vs, "metric": metric, "higher_is_better": higher, "ledger": show_path(ledger.path),
            "confidence": rows[0]["comparison"]["confidence"], "candidates": rows, "noise": noise_used(rows),
            "probes": _probes(ledger, [*candidates, vs], rows[-1]["comparison"]["metric"], current, choice),
            "recommendation": recommend(rows, vs, higher, compare)}


def report(ws: Workspace, req: Report, *, echo: Echo = print) -> dict:
    """``vecmerge report``: ``gather``, render, write FILE.md (``--out``) and FILE.html beside it (both or neither);
    ``--force`` replaces files this command wrote before (never any other file)."""
    md_path = Path(req.out)
    html_path = md_path.with_suffix(".html")
    ledger_path = Ledger(ws.ledger_path).path
    policy = OutputPolicy.for_command(inputs=[ledger_path, *([ws.file] if ws.file else [])],
                                      workspace_adapters=ws.adapters, base_model=ws.base_model, force=req.force)
    policy.check_file(md_path, MARKDOWN_REPORT, flag="--out")
    policy.check_file(html_path, HTML_REPORT, flag="--out")
    plots.pyplot("report")  # matplotlib missing: refused before any work
    data = gather(ws, list(req.candidates), req.vs, req.metric, req.env)
    figures = plots.report_figures(data)
    texts = {md_path: report_markdown.render_report(data, html_path.name),
             html_path: report_html.render_report(data, figures)}
    with OutputTransaction(policy) as txn:
        staged = {p: txn.file(p, MARKDOWN_REPORT if p == md_path else HTML_REPORT, flag="--out") for p in texts}
        for p, text in texts.items():
            staged[p].write_text(text, encoding="utf-8")
        txn.commit()
    rec = data["recommendation"]
    echo(rec["headline"])
    for line in rec["reasons"]:
        echo(f"  - {line}")
    echo(f"report: {md_path} and {html_path}")
    return data
