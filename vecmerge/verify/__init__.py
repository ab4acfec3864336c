"""vecmerge verify: an output re-derived and checked, every file and figure accounted for, the real PEFT client."""
