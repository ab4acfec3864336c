"""Every write: which paths may be written, staged transactions committed all or none, recovery, renames."""
