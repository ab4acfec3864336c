"""The figures: each panel zoomed to its data (not 0.5-1.0), far single runs drawn at the edge with their value,
sub-scores drawn as panels of their own (the ``show --plot`` fix of issue 33), and the report's two figures."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from scipy import stats

pytest.importorskip("matplotlib")

from vecmerge.report.plots import limits, report_figures, show_fig  # noqa: E402

EXAMPLES = Path(__file__).parents[2] / "examples" / "evidence"
V28 = [0.9836, 0.9890]
V58 = [1.0282, 1.0234, 1.0145]


def test_limits_zoom_to_the_models_with_intervals_and_flag_far_single_runs():
    points = [{"label": "a", "mean": 1.0065, "low": 0.9922, "high": 1.0209},
              {"label": "b", "mean": 1.0220, "low": 1.0048, "high": 1.0393},
              {"label": "c", "mean": 0.9944, "low": None, "high": None},
              {"label": "far", "mean": 0.4925, "low": None, "high": None}]
    lo, hi, far = limits(points)
    assert far == [3]  # 0.4925 lies more than one core width (0.0471) below the core
    width = 1.0393 - 0.9922
    assert lo == pytest.approx(0.9922 - 0.12 * width, rel=1e-12) and hi == pytest.approx(1.0393 + 0.12 * width,
                                                                                          rel=1e-12)
    # zero spread (a sub-score in grades): no core to zoom to, every value shows
    flat = [{"label": "a", "mean": 0.2453, "low": 0.2453, "high": 0.2453},
            {"label": "b", "mean": 0.0920, "low": None, "high": None}]
    lo, hi, far = limits(flat)
    assert far == [] and lo < 0.0920 and hi > 0.2453


def test_show_plot_zooms_to_the_data_and_draws_every_sub_score(tmp_path, monkeypatch, run_cli):
    """The user's 21 models: the total's axis spans the repeated models' intervals (about 0.85-1.05, not 0.5-1.0),
    the far models (v45 0.4925, ...) are marked at the edge with their values, and item_understanding has a panel."""
    monkeypatch.chdir(tmp_path)
    res = run_cli("evidence", "import", EXAMPLES / "scores.csv", EXAMPLES / "history.csv", "--higher-is-better",
                  "official_total")
    assert res.exit_code == 0, res.output
    from vecmerge.commands import summaries as operations
    from vecmerge.evidence.ledger.ledger import Ledger

    d = operations.show(Ledger(tmp_path / "vecmerge-evidence.db"))
    fig = show_fig(d)
    total, sub = fig.axes
    assert total.get_ylabel() == "official_total" and sub.get_title() == "official_total / item_understanding"
    lo, hi = total.get_ylim()
    v28_low = np.mean(V28) - stats.t.ppf(0.975, 1) * np.std(V28, ddof=1) / np.sqrt(2)
    v58_high = np.mean(V58) + stats.t.ppf(0.975, 2) * np.std(V58, ddof=1) / np.sqrt(3)
    core = v58_high - v28_low  # v2's 0.8659 lies within one core width below, v1's 0.7745 does not
    assert 0.8659 > v28_low - core > 0.7745
    pad = 0.12 * (v58_high - 0.8659)
    assert (lo, hi) == (pytest.approx(0.8659 - pad, rel=1e-9), pytest.approx(v58_high + pad, rel=1e-9))
    assert hi - lo < 0.25
    written = {t.get_text() for t in total.texts}
    assert {"0.4925", "0.5061", "0.7745"} <= written  # off this scale, value written
    slo, shi = sub.get_ylim()
    assert slo < 0.0920 and shi > 0.2453  # the grades 0.0920 .. 0.2453 all show
    width, height = fig.get_size_inches() * fig.dpi
    assert height > 400 and width <= 1600


def test_report_figures_are_pngs_of_totals_and_sub_scores():
    sub = {"key": "k1", "a_summary": {"mean": 0.25, "n": 2, "single_run": False, "ci_low": 0.24, "ci_high": 0.26},
           "b_summary": {"mean": 0.25, "n": 5, "single_run": False, "ci_low": 0.245, "ci_high": 0.255}}
    cmp = {"a_summary": {"mean": 1.02, "n": 3, "single_run": False, "ci_low": 1.005, "ci_high": 1.039},
           "b_summary": {"mean": 1.0065, "n": 5, "single_run": False, "ci_low": 0.992, "ci_high": 1.021},
           "decided_by": "welch", "welch": {"diff": 0.0155, "ci_low": -0.0005, "ci_high": 0.0316},
           "subscores": {"subscores": {"k1": sub}}}
    one = {**cmp, "a_summary": {"mean": 0.9944, "n": 1, "single_run": True, "ci_low": None, "ci_high": None},
           "decided_by": None, "subscores": None}
    d = {"backbone": "v51", "metric": "m", "confidence": 0.95,
         "candidates": [{"name": "v58", "comparison": cmp}, {"name": "v59", "comparison": one}]}
    figs = report_figures(d)
    assert set(figs) == {"totals", "subscores"}
    assert all(b[:8] == b"\x89PNG\r\n\x1a\n" for b in figs.values())
