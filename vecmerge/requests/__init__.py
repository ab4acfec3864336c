"""Each command's inputs as one typed request: the one place an option is declared (no click, no torch).

    spec.py      Spec (flag, help, type, default, check), option/argument, Request (checked whole)
    shared.py    the options several commands share: --metric, --env, --json, --stale, --plot, ...
    evidence.py  evidence add/import/export/show, ls, gate
    judging.py   evidence compare/plan/decide/calibrate, rank, report
    adapters.py  inspect, audit, verify
    models.py    extract, fuse, probe, demo
    search.py    search
    merging.py   what a run of project/merge/refactor/run does besides its recipe

``cli/generated.py`` makes each command's click parameters and ``--help`` from its request; ``commands/``
takes the request. project/merge/refactor/run read the recipe's table of keys instead (``recipe/keys.py``).
"""

from .adapters import Audit, Inspect, Verify
from .evidence import EvidenceAdd, EvidenceExport, EvidenceImport, EvidenceShow, Gate, Ls
from .judging import EvidenceCalibrate, EvidenceCompare, EvidenceDecide, EvidencePlan, Rank, Report
from .merging import RunFlags
from .models import Demo, Extract, Fuse, Probe
from .search import Search
from .spec import Request

__all__ = ["Request", "Inspect", "Audit", "Verify", "EvidenceAdd", "EvidenceImport", "EvidenceExport", "EvidenceShow",
           "Ls", "Gate", "EvidenceCompare", "EvidencePlan", "EvidenceDecide", "EvidenceCalibrate", "Rank", "Report",
           "Extract", "Fuse", "Probe", "Demo", "Search", "RunFlags"]
