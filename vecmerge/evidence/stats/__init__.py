"""Statistics: summaries, difference tests, noise and power, variance components, Holm, grades, plans' tests."""
