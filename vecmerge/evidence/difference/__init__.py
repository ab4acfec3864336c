"""Difference tests of A - B as a registry: one file per test, found by name (as ``methods/`` finds methods).

``registry.register`` adds a test; every module of this package is imported here, so a new
``difference/<name>.py`` whose class is decorated with ``@register`` is found by ``compare``, the
sub-scores, the report, the gate and the plans without an edit elsewhere (docs/ARCHITECTURE.md).
"""

from __future__ import annotations

import importlib
import pkgutil

from .registry import (
    DifferenceTest,
    Scores,
    deciding,
    decision_order,
    first_needing,
    get,
    names,
    register,
    report_order,
    run_all,
    unregister,
)
from .result import DiffResult, difference_test, mean_std, t_interval

for _info in pkgutil.iter_modules(__path__):
    if _info.name not in ("registry", "result"):
        importlib.import_module(f"{__name__}.{_info.name}")

__all__ = ["DiffResult", "DifferenceTest", "Scores", "decision_order", "deciding", "difference_test",
           "first_needing", "get", "mean_std", "names", "register", "report_order", "run_all", "t_interval",
           "unregister"]
