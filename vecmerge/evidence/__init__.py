"""Evidence before merging: an evaluation ledger, error bars, proxy calibration, lineage and the gate.

Pure library code (no torch, no click): the CLI and the pipeline are thin layers over it.

    ledger.py      Ledger(path): SQLite records of evaluations, tied to the adapter's content sha256
    records.py     what the ledger stores (Entry, Record, Plan) and the stale rule
    stored.py      the ledger's rows read back, every cell checked (a ledger changed outside vecmerge refused)
    environment.py the eval environment of a record: canonical fields, its id, never two pooled
    importers.py   CSV, lm-eval results JSON and --log_samples JSONL -> entries (all parsed, then written)
    lm_eval.py     lm-eval's files: scores, directions, each task's environment, the model matched by its path
    schema.py      the ledger's SQLite schema, its version, and the migrations of older ledgers
    stats.py       summaries, and Welch / paired / clustered tests of a difference (Miller 2024)
    noise.py       the ledger's pooled within-model noise, power, and the repeats a difference needs
    variance.py    variance components of training replicates: between trainings, within evaluations (ANOVA)
    replicates.py  replicate groups (replicate_of:), their components, the test whose unit is a training
    holm.py        Holm's step-down correction across sub-scores
    grades.py      discrete grades: whether a score's values lie on a grid, and its step
    subscores.py   every sub-score of A against B: tests, Holm, margins, what a change costs the others
    compare.py     A against B: the tests, the noise, repeats needed, a verdict in words, the sub-scores
    sequential.py  pre-registered plans: the anytime-valid t-mixture test and its stop/continue decision
    group_sequential.py  group-sequential boundaries: crossing probabilities, Lan-DeMets alpha spending
    planned.py     planned looks (the default plan): a group-sequential Welch test with futility
    plan_power.py  a plan's power, expected runs and fixed-n runs, by seeded simulation of its own rule
    plan_chain.py  the plans' integrity record: a sha256 chained over the plan rows
    calibrate.py   is a proxy metric able to rank candidates on the target? (Spearman, Kendall, bootstrap)
    loo.py         the same judged held out: a least-squares fit of the target on proxies, each model left out
    ranking.py     new candidates ranked by a calibrated prediction, or flagged far below the others
    pairs.py       pair records: a number of two models on one item (a probe's KL and JS), in the same ledger
    gate_config.py the gate's thresholds (the gate: section), every bad key at once
    gate.py        the seven-condition gate over facts the caller gathers
    gate_facts.py  the ledger's part of those facts, in one eval environment, with training noise
    suggest.py     "did you mean": a typed name within two edits of a workspace name
    operations.py  one JSON-ready function per evidence command (the CLI only parses flags and prints), from:
    ops_ledger.py    add, import, export, show, ls: record and read the ledger
    ops_judge.py     compare, calibrate (--loo), rank: judge models on its records, one environment each
    ops_plans.py     plan and decide: pre-registered plans (their weights and looks shared with gate_facts)
"""

from __future__ import annotations

from ..errors import EvidenceError, LineageError

__all__ = ["EvidenceError", "LineageError"]
