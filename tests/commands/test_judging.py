"""The judging commands' ledger operations over a real ledger file: compare and calibrate."""

from __future__ import annotations

import json

import pytest
from toy_ledger import CURRENT, SHA28, M, toy_ledger

from vecmerge.commands import judging as commands
from vecmerge.commands.recording import add
from vecmerge.evidence import EvidenceError
from vecmerge.evidence.ledger.ledger import Ledger


@pytest.fixture
def ledger(tmp_path) -> Ledger:
    return toy_ledger(tmp_path / "vecmerge-evidence.db")


def test_compare(ledger):
    out = commands.compare_models(ledger, "v51", "v28", current_sha=CURRENT)
    assert out["verdict"] == "v51 is better beyond eval noise" and out["welch"]["n"] == [5, 2]
    assert out["pooled"]["models"] == ["v51", "v28", "v54"]
    json.dumps(out)


def test_calibrate_needs_known_metrics(ledger):
    with pytest.raises(EvidenceError, match="metric 'local_cv'"):
        commands.calibrate_metrics(ledger, "local_cv", M)
    add(ledger, "v28", [0.5], metric="local_cv", sha256=SHA28)
    out = commands.calibrate_metrics(ledger, "local_cv", M, current_sha=CURRENT)
    assert out["verdict"] == "too few models" and out["models"] == ["v28"]


def test_the_examples_walkthrough_figures(capsys):
    """examples/evidence/README.md quotes these verdicts and repeat counts; keep them true."""
    import runpy
    from pathlib import Path

    script = Path(__file__).parents[2] / "examples" / "evidence" / "walkthrough.py"
    out = runpy.run_path(str(script))["main"]()
    assert out[("v51", "v28")].verdict_code == "a_better" and out[("v51", "v28")].repeats_needed == 5
    assert out[("v59", "v58")].verdict_code == "not_enough_runs" and out[("v59", "v58")].repeats_needed == 4
    assert out[("v58", "v51")].verdict_code == "within_noise" and out[("v58", "v51")].repeats_needed == 8
    assert out[("v58", "v51")].welch.p == pytest.approx(0.0558, abs=5e-5)
    assert "pooled within-model noise: sd 0.0096 over v51, v28, v58 (7 df)" in capsys.readouterr().out


def test_compare_reports_every_sub_score_keyed_by_name(ledger):
    add(ledger, "x", [1.0, 1.01, 0.99], metric="tot", sha256=None, higher_is_better=True,
                 subs={"video": [0.31, 0.32, 0.30], "item": [0.2453] * 3})
    add(ledger, "y", [0.97, 0.98, 0.99], metric="tot", sha256=None,
                 subs={"video": [0.28, 0.29, 0.27], "item": [0.2453] * 3})
    out = commands.compare_models(ledger, "x", "y", "tot", target="video")
    subs = out["subscores"]
    assert set(subs["subscores"]) == {"item", "video"} and subs["target"] == "video"
    assert subs["subscores"]["item"]["kind"] == "exact" and subs["cost"]["not_worse"] == ["item"]
    assert subs["subscores"]["video"]["test"]["kind"] == "welch"
    with pytest.raises(EvidenceError, match="--target world: x and y recorded no such sub-score of tot; known: item"):
        commands.compare_models(ledger, "x", "y", "tot", target="world")
    json.dumps(out)
