"""What each ``vecmerge`` command does once its flags are parsed: library calls, then rendering.

``cli/`` turns flags into these calls; ``demo/`` calls them directly with the arguments of the commands it
prints, so the transcript is exactly what a user typing them would see. Every function writes through
``echo(text, err=False)`` and raises ``VecmergeError`` subclasses (a failed check: ``CheckFailed``, exit 1).

    adapters.py   inspect, audit
    merging.py    merge (project, merge, refactor, run), merge_config (merge --config), verify
    evidence.py   evidence add/import/export/show/compare/calibrate/plan/decide, ls, gate
    models.py     extract, fuse
    probe.py      probe
    search.py     search (constrained search; top K written through the pipeline)
    rank.py       rank
    report.py     report (recommend.py: its advice)
"""

from .adapters import audit, inspect
from .evidence import (
                       evidence_add,
                       evidence_calibrate,
                       evidence_compare,
                       evidence_decide,
                       evidence_export,
                       evidence_import,
                       evidence_plan,
                       evidence_show,
                       gate,
                       ls,
)
from .merging import merge, merge_config, verify
from .models import extract, fuse
from .probe import probe
from .rank import rank
from .report import report
from .search import search

__all__ = ["inspect", "audit", "merge", "merge_config", "verify", "evidence_add", "evidence_import", "evidence_export",
           "evidence_show", "evidence_compare", "evidence_calibrate", "evidence_plan", "evidence_decide", "ls", "gate",
           "extract", "fuse", "probe", "rank", "report", "search"]
