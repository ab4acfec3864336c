"""Importers: CSV, lm-eval results JSON and --log_samples JSONL parsed into ledger entries; an lm-eval output
tree found and matched run by run (``lm_eval_tree``), a group's items and environment (``lm_eval_groups``)."""
