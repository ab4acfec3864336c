"""The evidence renderers: one table per command (the --plot writer is tested through the CLI)."""

from __future__ import annotations

from vecmerge.report.evidence import render_gate


def test_render_gate_wraps_and_names_what_did_not_pass():
    rows = [{"condition": c, "status": s, "detail": "d " * 60, "threshold": "t", "source": "default", "numbers": {}}
            for c, s in (("common base", "PASS"), ("small trust region", "FAIL"), ("module consensus", "UNKNOWN"))]
    text = render_gate({"backbone": "v54", "x": "v51", "y": "v28", "metric": "acc", "ledger": "l.db", "rows": rows})
    assert text.splitlines()[0] == "gate: v54 + alpha * (v51 - v28); metric acc; ledger l.db"
    assert max(len(line) for line in text.splitlines()) < 160
    assert text.splitlines()[-1] == ("NOT PASSED: small trust region FAIL, module consensus UNKNOWN "
                                     "(UNKNOWN is not a pass)")


def test_the_gate_line_names_only_what_happened():
    """Issue 23: "(UNKNOWN is not a pass)" only when a row is UNKNOWN."""
    from vecmerge.report.evidence import gate_verdict

    def rows(*statuses):
        return {"rows": [{"condition": f"c{i}", "status": s} for i, s in enumerate(statuses)]}

    assert gate_verdict(rows("PASS", "FAIL")) == "NOT PASSED: c1 FAIL"
    assert gate_verdict(rows("UNKNOWN", "FAIL")) == "NOT PASSED: c0 UNKNOWN, c1 FAIL (UNKNOWN is not a pass)"
    assert gate_verdict(rows("PASS", "PASS")) == "PASSED: all 2 conditions"
