"""The difference-test registry: tests are found by name, chosen in the declared order, and spelled nowhere else.

A toy test registered for one test is run by ``compare``, rendered by the report and read by the gate with no
edit outside its registration; its numbers are checked against scipy's one-sample t test (rel 1e-12)."""

from __future__ import annotations

import ast
import math
from dataclasses import dataclass
from pathlib import Path

import pytest
from scipy import stats

import vecmerge
from vecmerge.evidence import EvidenceError, difference
from vecmerge.evidence.difference.registry import ITEMS, Scores
from vecmerge.evidence.difference.result import DiffResult, difference_test
from vecmerge.evidence.gate.gate import PASS, GateFacts, evaluate_gate
from vecmerge.evidence.judge.compare import compare_records
from vecmerge.evidence.ledger.ledger import Record
from vecmerge.report.evidence import render_compare

PACKAGE = Path(vecmerge.__file__).parent


def test_no_module_outside_the_registry_spells_a_test_name():
    """No string and no attribute ``x.<name>`` equal to a registered test's name outside evidence/difference/:
    compare, sub-scores, report, gate and plans reach every test through the registry."""
    known = set(difference.names()) | set(difference.names(plan=True))
    assert {"welch", "paired", "clustered", "t-mixture"} <= known
    spelled = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if any(PACKAGE / part in path.parents for part in ("evidence/difference", "cli", "requests")):
            continue  # requests/ spells the words a user types (``--kind group-sequential``) and maps them
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            word = (node.value if isinstance(node, ast.Constant) and isinstance(node.value, str)
                    else node.attr if isinstance(node, ast.Attribute) else None)
            if word in known:
                spelled.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: {word}")
    assert spelled == []


def test_the_declared_orders_keep_the_verdict_rule_and_the_report_rows():
    decide = [t.name for t in difference.decision_order()]
    shown = [t.name for t in difference.report_order()]
    assert [n for n in decide if n in ("clustered", "paired", "welch")] == ["clustered", "paired", "welch"]
    assert [n for n in shown if n in ("clustered", "paired", "welch")] == ["welch", "paired", "clustered"]
    assert "t-mixture" not in decide + shown and difference.names(plan=True) == ("group-sequential", "t-mixture")
    with pytest.raises(EvidenceError, match="test 'welch-peeking': use one of .*t-mixture.*welch"):
        difference.get("welch-peeking")


@dataclass(frozen=True)
class Toy:
    """A one-sample t test of the per-item differences against 0 that decides before every other test."""

    name: str = "toy-first"
    summary: str = "toy"
    needs: str = ITEMS
    decides: int = -1
    shown: int = 99

    def run(self, scores: Scores, confidence: float) -> DiffResult | None:
        common = scores.common()
        d = [scores.items_a[i] - scores.items_b[i] for i in common]
        n = len(d)
        mean = math.fsum(d) / n
        sd = math.sqrt(math.fsum((x - mean) ** 2 for x in d) / (n - 1))
        return difference_test(self.name, mean, sd / math.sqrt(n), n - 1, (n,), confidence)

    def size(self, result) -> str:
        return f"{result['n'][0]} toy items"


@pytest.fixture
def toy():
    difference.register(Toy)
    yield Toy()
    difference.unregister(Toy.name)


def test_a_registered_test_is_chosen_rendered_and_gated_without_an_edit_elsewhere(toy):
    a = [0.9, 0.7, 0.8, 0.6, 0.95]
    b = [0.5, 0.6, 0.4, 0.55, 0.5]
    recs = [Record(i, "A", None, "acc", v, item=f"q{i}") for i, v in enumerate(a)]
    recs += [Record(10 + i, "B", None, "acc", v, item=f"q{i}") for i, v in enumerate(b)]
    c = compare_records("A", "B", recs, higher_is_better=True)
    ref = stats.ttest_1samp([x - y for x, y in zip(a, b)], 0.0)
    assert c.decided_by == "toy-first" and c.paired is not None  # the paired test ran too, it no longer decides
    toy_result = dict(c.tests)["toy-first"]
    assert (toy_result.t, toy_result.p) == pytest.approx(
        (ref.statistic, ref.pvalue), rel=1e-12)
    d = c.to_dict()
    keys = list(d)
    assert d["toy-first"]["n"] == [5] and keys[keys.index("b_summary") + 1:keys.index("pooled")] == [
        t.name for t in difference.report_order()] and keys.index("toy-first") == keys.index("pooled") - 1
    assert "5 toy items" in render_compare(d) and "(by the toy-first test)" in render_compare(d)
    row = evaluate_gate(GateFacts(backbone="base", x="A", y="B", comparison=c)).row("repeated evidence")
    assert row.status == PASS and f"(toy-first): diff {toy_result.diff:+.4g}" in row.detail
