"""Importers: CSV, lm-eval results JSON and --log_samples JSONL parsed into ledger entries."""
