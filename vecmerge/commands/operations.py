"""One function per evidence command, each returning JSON-ready data: the CLI only parses flags and prints.

The caller supplies what lives outside the ledger: ``current_sha`` (workspace name -> the adapter's current
content sha256, so stale records are left out), ``replicates`` (replicate groups, root -> members) and, for
``ls``, the workspace entries. ``env`` is the user's choice of eval environment (``environment.EnvChoice``):
no statistic pools records of two environments (``environment.one_environment`` refuses, naming the fields).

The functions live by command family; this module is the one the commands import:

    ops_ledger.py  add, import_, export, show, ls_rows: record and read the ledger
    ops_judge.py   compare_models, calibrate_metrics, calibrate_loo_metrics, rank: judge models on its records
    ops_plans.py   plan, decide (and check_plan_weights, plan_looks, shared with the gate): pre-registered plans
"""

from __future__ import annotations

from .ops_judge import calibrate_loo_metrics, calibrate_metrics, compare_models, rank
from .ops_ledger import add, export, import_, ls_rows, show
from .ops_plans import check_plan_weights, decide, plan, plan_looks

__all__ = ["add", "import_", "export", "show", "compare_models", "calibrate_metrics", "calibrate_loo_metrics", "rank",
           "ls_rows", "plan", "decide", "check_plan_weights", "plan_looks"]
