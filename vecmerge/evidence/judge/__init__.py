"""Judging models on the ledger's records: A against B, sub-scores, proxy calibration, ranking."""
