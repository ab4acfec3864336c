"""``vecmerge evidence ...``, ``vecmerge ls`` and ``vecmerge gate``: the ledger, plans and sequential decisions,
lineage and the seven-condition gate. Options, checks and help: ``vecmerge.requests``."""

from __future__ import annotations

from .. import requests as rq
from .app import main
from .generated import relay


@main.group()
def evidence():
    """The evaluation ledger: record scores, compare models with error bars, calibrate proxies.

    Scores live in vecmerge-evidence.db beside vecmerge.yaml (its evidence: key moves it), each tied to the
    adapter's content sha256: when a name points at other weights, its old scores are stale and left out.
    """


relay(evidence, rq.EvidenceAdd, "add", "evidence_add", context_settings={"ignore_unknown_options": True})
for request, name in ((rq.EvidenceImport, "import"), (rq.EvidenceExport, "export"), (rq.EvidenceShow, "show"),
                      (rq.EvidenceCompare, "compare"), (rq.EvidencePlan, "plan"), (rq.EvidenceDecide, "decide"),
                      (rq.EvidenceCalibrate, "calibrate")):
    relay(evidence, request, name, f"evidence_{name}")
relay(main, rq.Ls, "ls", "ls")
relay(main, rq.Gate, "gate", "gate", progress=True)
