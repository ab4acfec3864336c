"""The merge gate: its thresholds, its seven conditions, and the ledger's facts it judges."""
