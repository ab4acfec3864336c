"""``vecmerge evidence ...``, ``vecmerge ls`` and ``vecmerge gate``: the ledger, plans and sequential decisions,
lineage and the seven-condition gate. Options, checks and help: ``vecmerge.requests``."""

from __future__ import annotations

from .. import requests as rq
from .app import Ctx, echo, main
from .generated import command


@main.group()
def evidence():
    """The evaluation ledger: record scores, compare models with error bars, calibrate proxies.

    Scores live in vecmerge-evidence.db beside vecmerge.yaml (its evidence: key moves it), each tied to the
    adapter's content sha256: when a name points at other weights, its old scores are stale and left out.
    """


@command(evidence, rq.EvidenceAdd, "add", context_settings={"ignore_unknown_options": True})
def evidence_add(obj: Ctx, req: rq.EvidenceAdd) -> None:
    from .. import commands

    commands.evidence_add(obj.ws(), req, echo=echo)


@command(evidence, rq.EvidenceImport, "import")
def evidence_import(obj: Ctx, req: rq.EvidenceImport) -> None:
    from .. import commands

    commands.evidence_import(obj.ws(), req, echo=echo)


@command(evidence, rq.EvidenceExport, "export")
def evidence_export(obj: Ctx, req: rq.EvidenceExport) -> None:
    from .. import commands

    commands.evidence_export(obj.ws(), req, echo=echo)


@command(evidence, rq.EvidenceShow, "show")
def evidence_show(obj: Ctx, req: rq.EvidenceShow) -> None:
    from .. import commands

    commands.evidence_show(obj.ws(), req, echo=echo)


@command(evidence, rq.EvidenceCompare, "compare")
def evidence_compare(obj: Ctx, req: rq.EvidenceCompare) -> None:
    from .. import commands

    commands.evidence_compare(obj.ws(), req, echo=echo)


@command(evidence, rq.EvidencePlan, "plan")
def evidence_plan(obj: Ctx, req: rq.EvidencePlan) -> None:
    from .. import commands

    commands.evidence_plan(obj.ws(), req, echo=echo)


@command(evidence, rq.EvidenceDecide, "decide")
def evidence_decide(obj: Ctx, req: rq.EvidenceDecide) -> None:
    from .. import commands

    commands.evidence_decide(obj.ws(), req, echo=echo)


@command(evidence, rq.EvidenceCalibrate, "calibrate")
def evidence_calibrate(obj: Ctx, req: rq.EvidenceCalibrate) -> None:
    from .. import commands

    commands.evidence_calibrate(obj.ws(), req, echo=echo)


@command(main, rq.Ls, "ls")
def ls_cmd(obj: Ctx, req: rq.Ls) -> None:
    from .. import commands

    commands.ls(obj.ws(), req, echo=echo)


@command(main, rq.Gate, "gate")
def gate_cmd(obj: Ctx, req: rq.Gate) -> None:
    from .. import commands

    commands.gate(obj.ws(), req, echo=echo, progress=obj.bars())
