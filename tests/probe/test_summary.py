"""probe/summary.py: per-task changes from a reference model, against numpy's own paired statistics."""

from __future__ import annotations

import numpy as np
import pytest

from vecmerge.probe.summary import task_changes


def test_task_changes_are_paired_means_with_standard_errors_per_task():
    """Each task's change is the mean of the paired differences, its se the sample sd / sqrt(n), as numpy says."""
    rng = np.random.default_rng(0)
    ids = [str(i) for i in range(12)]
    tasks = ["a", "b", "c"] * 4
    ref = {i: {"loglik": float(rng.normal()), "task": t} for i, t in zip(ids, tasks)}
    new = {i: {"loglik": ref[i]["loglik"] + float(rng.normal(0.1)), "task": t} for i, t in zip(ids, tasks)}
    got = task_changes(new, ref)
    assert set(got) == {"a", "b", "c", "all"}
    for t in ("a", "b", "c", "all"):
        d = np.array([new[i]["loglik"] - ref[i]["loglik"] for i, tt in zip(ids, tasks) if t in ("all", tt)])
        assert got[t]["change"] == pytest.approx(d.mean(), rel=1e-12)
        assert got[t]["se"] == pytest.approx(d.std(ddof=1) / np.sqrt(len(d)), rel=1e-12)
        assert got[t]["items"] == len(d) and got[t]["lower"] == int((d < 0).sum())
    one = task_changes({"x": {"loglik": 1.0, "task": "a"}}, {"x": {"loglik": 0.5, "task": "a"}})
    assert one["a"] == {"change": 0.5, "se": None, "items": 1, "lower": 0}
