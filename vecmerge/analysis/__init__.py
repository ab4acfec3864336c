"""What vecmerge measures before it writes: per-module consensus, the audit, the trust-region step, inspect."""
