"""A protected step on a small model trained in the test on three tasks: it costs the protected tasks less.

Three tasks share one input ``x`` and disagree on the answer: item ``[marker_t, x] -> 30 + (x + 7 t) mod 30``.
A LoRA backbone is trained on tasks 1 and 2; training it further on task 0 alone (the target) gives the direction,
which pulls every marker towards task 0's answers (``tests/three_tasks.py``). The plain step and the step protected
on tasks 1 and 2, at the same trust, are scored by the test's own forward pass (the written dense updates added by
its own hooks).
"""

from __future__ import annotations

import json

import pytest
from three_tasks import build
from three_tasks import loglik as _loglik


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """``(root, base)``: the three-task toy (``tests/three_tasks.py``)."""
    root = tmp_path_factory.mktemp("protect_trained")
    return root, build(root)


@pytest.mark.slow
def test_the_protected_step_lowers_a_protected_task_less_than_the_plain_step(trained, run_cli, dense_updates,
                                                                              monkeypatch):
    """At the same trust, the plain step costs tasks 1 and 2 log-likelihood; the protected step costs them less."""
    root, base = trained
    monkeypatch.chdir(root)
    plain = run_cli("project", "--base", "bb", "--dir", "t0 - bb", "--alpha", "1", "--out", "plain", "--json",
                    "--force")
    assert plain.exit_code == 0, plain.output
    trust = json.loads(plain.output)["outputs"][0]["realized"]["global"]
    res = run_cli("project", "--base", "bb", "--dir", "t0 - bb", "--trust", trust, "--protect", "p1=task1.jsonl",
                  "--protect", "p2=task2.jsonl", "--target", "t0=task0.jsonl", "--base-model", base,
                  "--protect-energy", "0.9", "--out", "prot", "--json", "--force")
    assert res.exit_code == 0, res.output
    rep = json.loads(res.output)["outputs"][0]
    assert rep["realized"]["global"] == pytest.approx(trust, rel=1e-9)
    before = _loglik(base, dense_updates(root / "bb"))
    after_plain = _loglik(base, dense_updates(root / "plain"))
    after_prot = _loglik(base, dense_updates(root / "prot"))
    drop_plain = [before[t] - after_plain[t] for t in (1, 2)]
    drop_prot = [before[t] - after_prot[t] for t in (1, 2)]
    # measured: before (-10.11, -0.0049, -0.0047), plain (-0.074, -5.65, -6.52), protected (-5.14, -1.09, -0.56)
    assert after_plain[0] > before[0] and after_prot[0] > before[0]  # the direction raises the target
    assert min(drop_plain) > 0.05, (before, after_plain)  # ... and costs the protected tasks
    for t in range(2):
        assert drop_prot[t] < drop_plain[t], (drop_prot, drop_plain)
    assert rep["protection"]["protect"]["p1"]["kept_drift"] < 0.5
