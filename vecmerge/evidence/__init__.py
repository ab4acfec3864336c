"""Evidence before merging: an evaluation ledger, error bars, proxy calibration, lineage and the gate.

Pure library code (no torch, no click): the CLI and the commands (``commands/``: recording, summaries,
judging, plans, gate) are thin layers over it.

    ledger/     the SQLite ledger, its records, schema, stored rows (plans chained), eval environments, pair
                records, names, the precision scores were written with
    importers/  CSV, lm-eval results JSON and --log_samples JSONL -> entries (all parsed, then written); a
                folder of lm-eval runs matched file by file; a group's items are its subtasks'
    stats/      summaries and difference tests, pooled noise, variance components, replicates, Holm, grades,
                and the pre-registered plans: planned looks (group-sequential boundaries, their power) and the
                anytime-valid test
    judge/      A against B with its sub-scores, proxy calibration (and held out), ranking new candidates
    gate/       the gate's thresholds, its seven conditions, and the ledger's part of its facts
"""

from __future__ import annotations

from ..errors import EvidenceError, LineageError

__all__ = ["EvidenceError", "LineageError"]
