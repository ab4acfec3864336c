"""The report's content blocks, rendered as Markdown and HTML: a recorded gate, a probe with its calibration and a
plan that can no longer be judged are shown as recorded; a stranger's names are escaped in both files."""

from __future__ import annotations

from pathlib import Path

import pytest

from vecmerge.report.candidates import blocks
from vecmerge.report.html import render_report as render_html
from vecmerge.report.markdown import render_report as render_markdown

SCORES = Path(__file__).parents[2] / "examples" / "evidence" / "scores.csv"

GATE = {"backbone": "v54", "x": "v51", "y": "v28", "metric": "official_total", "passed": False,
        "rows": [{"condition": "common base", "status": "PASS", "detail": "one base model", "threshold": "-",
                  "source": "default"},
                 {"condition": "stable backbone", "status": "UNKNOWN", "detail": "v54: 0 runs", "threshold": ">= 3",
                  "source": "gate: min_repeats"}]}


@pytest.fixture
def gathered(tmp_path, monkeypatch, run_cli):
    monkeypatch.chdir(tmp_path)
    assert run_cli("evidence", "import", SCORES, "--higher-is-better", "official_total").exit_code == 0
    from vecmerge.commands.report import gather
    from vecmerge.workspace.names import Workspace

    return gather(Workspace(None), ["v58", "v59"], "v51")


def test_a_recorded_gate_probe_and_broken_plan_are_shown_as_recorded(gathered):
    d = gathered
    d["candidates"][0]["gate"] = GATE
    d["candidates"][1]["plan"] = {"decision": None, "error": "plan 1: v59 now has other weights"}
    d["probes"] = [{"metric": "probe:toy:loglik", "calibration": None, "calibration_error": "too few models",
                    "summaries": [{"model": "v58", "n": 1, "mean": -1.25, "ci_low": None, "ci_high": None}]}]
    md = render_markdown(d, "r.html")
    assert "Gate before v58 was written (v54 + alpha * (v51 - v28)): NOT PASSED" in md
    assert "| stable backbone | UNKNOWN | v54: 0 runs | >= 3 | gate: min_repeats |" in md
    assert "Plan: cannot be judged: plan 1: v59 now has other weights" in md
    assert "### probe:toy:loglik" in md and "| v58 | 1 | -1.25 | - |" in md and "calibration: too few models" in md
    html = render_html(d, {})
    assert "<td>stable backbone</td><td>UNKNOWN</td>" in html and "<img" not in html  # no figures given, none shown


def test_names_are_escaped_in_both_files(gathered):
    d = gathered
    d["candidates"][0]["reasons"] = ["a <script>alert(1)</script> | pipe"]
    md = render_markdown(d, "r.html")
    html = render_html(d, {})
    assert "a &lt;script>alert(1)&lt;/script> \\| pipe" in md and "<script" not in md
    assert "<script" not in html and "&lt;script&gt;alert(1)&lt;/script&gt; | pipe" in html
    assert [b[0] for b in blocks(d)][:3] == ["h", "p", "h"]
