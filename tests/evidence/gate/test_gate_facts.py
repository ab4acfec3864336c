"""The gate's ledger facts: one eval environment, and training plus evaluation noise once replicates exist.

The flip: the same ledger gated twice. Read as five unrelated models, the backbone v54 looks stable (std 0.0005
against the others' evaluation noise, about 0.001) and v51 beats v28 by 0.02 over three runs each. Declared as
replicates (v54b: another seed of v54, v51b: of v51), the trainings disagree by far more than the evaluations:
training noise larger than evaluation noise, so the backbone is not stable and v51's lead is within noise.
"""

from __future__ import annotations

import pytest

from vecmerge.commands.recording import add
from vecmerge.commands.summaries import show
from vecmerge.evidence import EvidenceError
from vecmerge.evidence.gate.gate import FAIL, PASS, GateConfig, GateFacts, evaluate_gate
from vecmerge.evidence.gate.gate_facts import gate_evidence
from vecmerge.evidence.ledger.environment import EnvChoice
from vecmerge.evidence.ledger.ledger import Ledger
from vecmerge.workspace.lineage import relation

M = "official_total"
RUNS = {"v54": [0.9940, 0.9950, 0.9946], "v54b": [1.0100, 1.0108, 1.0104],
        "v51": [1.010, 1.012, 1.011], "v51b": [0.985, 0.986, 0.987], "v28": [0.990, 0.991, 0.992]}
GROUPS = {"v54": ("v54", "v54b"), "v51": ("v51", "v51b")}


@pytest.fixture
def ledger(tmp_path) -> Ledger:
    ledger = Ledger(tmp_path / "vecmerge-evidence.db")
    for model, runs in RUNS.items():
        add(ledger, model, runs, metric=M, sha256=None, higher_is_better=True)
    return ledger


def gate(ledger, replicates=None, config=None, env=None):
    facts = GateFacts("v54", "v51", "v28", base_models={"v54": "B", "v51": "B", "v28": "B"}, shape_mismatches=[],
                      lineage=relation("v51", "v28", {"v51": "v28"}), consensus=(7, 7), trust=0.01,
                      **gate_evidence(ledger, "v54", "v51", "v28", M, replicates=replicates, config=config, env=env))
    result = evaluate_gate(facts, config)
    return result.row("stable backbone"), result.row("repeated evidence")


def test_replicates_that_reveal_training_noise_flip_both_noise_rows(ledger):
    stable, evidence = gate(ledger)
    assert (stable.status, evidence.status) == (PASS, PASS), (stable.detail, evidence.detail)
    assert stable.numbers["noise"] == evidence.numbers["noise"] == "evaluation"
    assert "evaluation noise only: no replicates of v54" in stable.detail
    assert "evaluation noise only: no replicates of v51 or v28" in evidence.detail

    stable, evidence = gate(ledger, GROUPS)
    assert (stable.status, evidence.status) == (FAIL, FAIL), (stable.detail, evidence.detail)
    assert stable.numbers["noise"] == evidence.numbers["noise"] == "training plus evaluation"
    comp = stable.numbers["components"]
    assert comp["members"] == ["v54", "v54b"] and comp["var_between_training"] > 10 * comp["var_within_eval"]
    assert "2 trainings (v54, v54b), 6 runs; training plus evaluation noise sd" in stable.detail
    assert stable.numbers["typical_noise"]["models"] == ["v51", "v51b", "v28"]  # outside the backbone's group
    assert evidence.detail.startswith("within training plus evaluation noise on official_total, over trainings "
                                      "(2 of v51: v51, v51b; 1 of v28: v28)")
    assert evidence.numbers["replicates"]["test"]["df"] == 1.0


def test_replicates_that_agree_keep_the_rows_passing(tmp_path):
    """Trainings that agree as closely as evaluations do: the rows still pass, now on training plus eval noise."""
    ledger = Ledger(tmp_path / "l.db")
    runs = {"v54": [0.9940, 0.9950, 0.9946], "v54b": [0.9944, 0.9948, 0.9942], "v51": [1.010, 1.012, 1.011],
            "v51b": [1.011, 1.013, 1.012], "v51c": [1.009, 1.011, 1.010], "v28": [0.990, 0.991, 0.992],
            "v28b": [0.991, 0.992, 0.990]}
    for model, values in runs.items():
        add(ledger, model, values, metric=M, sha256=None, higher_is_better=True)
    groups = {"v54": ("v54", "v54b"), "v51": ("v51", "v51b", "v51c"), "v28": ("v28", "v28b")}
    stable, evidence = gate(ledger, groups, GateConfig(backbone_noise_factor=2.0))
    assert (stable.status, evidence.status) == (PASS, PASS), (stable.detail, evidence.detail)
    assert evidence.detail.startswith("v51 is better beyond training plus evaluation noise")


def test_the_gate_never_pools_two_eval_environments(ledger):
    add(ledger, "v28", [0.96, 0.97], metric=M, sha256=None, env={"timeout": 900})
    with pytest.raises(EvidenceError) as info:
        gate(ledger)
    text = str(info.value)
    assert text.startswith("gate: v54, v51 and v28 on official_total: not the same measurement") and "timeout" in text
    stable, evidence = gate(ledger, env=EnvChoice.parse(["timeout=900"]))  # only v28's two runs there
    assert stable.status != PASS and evidence.status != PASS
    none = show(ledger)["environments"][0]["id"]
    stable, evidence = gate(ledger, config=GateConfig.from_dict({"env": none}))  # the config picks one
    assert (stable.status, evidence.status) == (PASS, PASS)
