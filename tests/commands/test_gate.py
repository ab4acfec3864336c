"""What the gate command judges: the ledger's evidence fed to the gate."""

from __future__ import annotations

import pytest
from toy_ledger import CURRENT, M, toy_ledger

from vecmerge.evidence.gate.gate import GateFacts, evaluate_gate
from vecmerge.evidence.gate.gate_facts import gate_evidence
from vecmerge.evidence.ledger.ledger import Ledger
from vecmerge.workspace.lineage import relation


@pytest.fixture
def ledger(tmp_path) -> Ledger:
    return toy_ledger(tmp_path / "vecmerge-evidence.db")


def test_gate_evidence_feeds_the_gate(ledger):
    facts = GateFacts("v54", "v51", "v28", base_models={"v54": "B", "v51": "B", "v28": "B"}, shape_mismatches=[],
                      lineage=relation("v51", "v28", {"v51": "v28"}), consensus=(196, 196), trust=0.0113,
                      **gate_evidence(ledger, "v54", "v51", "v28", M, current_sha=CURRENT))
    assert facts.typical_noise.models == ("v51", "v28")  # the backbone's own runs are not its yardstick
    result = evaluate_gate(facts)
    assert result.passed, [(r.condition, r.status, r.detail) for r in result.rows]
