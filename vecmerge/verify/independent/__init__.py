"""verify's own float64 derivation of an output, sharing no code with what it checks (a forbidden contract)."""
