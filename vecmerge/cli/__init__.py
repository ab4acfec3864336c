"""The ``vecmerge`` command (the only importer of click); ``vecmerge.cli:main`` is the console script.

    app.py           the group, global options, errors as one line, signals
    generated.py     a command's click parameters, checks and --help, made from its request (vecmerge.requests)
    recipe_flags.py  the flags that build a Recipe (project, merge, refactor, run), generated from the table of
                     recipe keys and the method registry; recipe problems worded with those flags; RunFlags
    inspect.py       inspect, audit
    merge.py         project, merge, refactor, run
    verify.py        verify
    evidence.py      evidence add/import/export/show/compare/calibrate, ls, gate
    models.py        extract, fuse
    probe.py         probe
    search.py        search
    rank.py          rank
    report.py        report
    demo.py          demo
"""

from . import demo, evidence, inspect, merge, models, probe, rank, report, search, verify  # noqa: F401  (each registers its commands)
from .app import main

__all__ = ["main"]
