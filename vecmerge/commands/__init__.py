"""What each ``vecmerge`` command does with its request: library calls, then rendering.

``cli/`` makes each command's request (``vecmerge.requests``) from its flags; ``demo/`` builds the requests of
the commands it prints, so the transcript is exactly what a user typing them would see. Every command takes
the workspace and its request, writes through ``echo(text, err=False)`` and raises ``VecmergeError``
subclasses (a failed check: ``CheckFailed``, exit 1). The ledger operations beside each command take a
``Ledger`` and return JSON-ready data (tests and benchmarks call them in-process).

    adapters.py   inspect, audit
    merging.py    merge (project, merge, refactor, run), merge_config (merge --config), verify
    recording.py  evidence add/import/export          summaries.py  evidence show, ls
    judging.py    evidence compare/calibrate, rank    plans.py      evidence plan/decide
    gate.py       gate                                models.py     extract, fuse
    probe.py      probe                               report.py     report (recommend.py: its advice)
    printing.py   the reports' shared output          progress.py   the progress-bar hand-off
    search.py     search (constrained search; top K written through the pipeline)
"""

from .adapters import audit, inspect
from .gate import gate
from .judging import evidence_calibrate, evidence_compare, rank
from .merging import merge, merge_config, verify
from .models import extract, fuse
from .plans import evidence_decide, evidence_plan
from .probe import probe
from .recording import evidence_add, evidence_export, evidence_import
from .report import report
from .search import search
from .summaries import evidence_show, ls

__all__ = ["inspect", "audit", "merge", "merge_config", "verify", "evidence_add", "evidence_import", "evidence_export",
           "evidence_show", "evidence_compare", "evidence_calibrate", "evidence_plan", "evidence_decide", "ls", "gate",
           "extract", "fuse", "probe", "rank", "report", "search"]
