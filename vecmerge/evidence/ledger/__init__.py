"""The evaluation ledger: its SQLite store, the records it holds, their eval environment, pair records, and the
precision each score was written with (``precision``)."""
