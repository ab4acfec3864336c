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


def _summary(mean: float, n: int) -> dict:
    one = n == 1
    return {"mean": mean, "n": n, "single_run": one, "ci_low": None if one else mean - 0.01,
            "ci_high": None if one else mean + 0.01}


def _report(names, backbone="v51", metric="official_total", sub="item_understanding") -> dict:
    """A gathered report (the keys ``report_figures`` reads): each candidate 0.003 above the last, one sub-score."""
    cands = []
    for i, name in enumerate(names):
        subs = {sub: {"key": sub, "a_summary": _summary(0.25 + 0.001 * i, 3), "b_summary": _summary(0.25, 5)}}
        cands.append({"name": name, "comparison": {
            "a_summary": _summary(1.0 + 0.003 * i, 3), "b_summary": _summary(1.0, 5), "decided_by": "welch",
            "welch": {"diff": 0.003 * i, "ci_low": 0.003 * i - 0.01, "ci_high": 0.003 * i + 0.01},
            "subscores": {"subscores": subs}}})
    return {"backbone": backbone, "metric": metric, "confidence": 0.95, "candidates": cands}


def test_eight_forty_character_names_never_overlap_and_every_name_stays_readable():
    """Stranger finding: long candidate names overlapped on the axis. Measured here with the renderer: no two tick
    labels' window extents intersect, each lies inside the figure, and each full name is on the axis (wrapped) or in
    the key under the figure (``N  name``)."""
    from vecmerge.report.plots import png_bytes, report_figs

    names = [f"qwen3-8b-lora-r64-alpha128-lr2e-5-seed{i:02d}"[:40].ljust(40, "x") for i in range(8)]
    assert all(len(n) == 40 for n in names) and len(set(names)) == 8
    figs = report_figs(_report(names))
    assert set(figs) == {"totals", "subscores"}
    for fig in figs.values():
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        key = "\n".join(t.get_text() for t in fig.texts)
        for ax in [a for a in fig.axes if a.get_visible()]:
            labels = [t for t in ax.get_xticklabels() if t.get_visible() and t.get_text()]
            boxes = [t.get_window_extent(renderer) for t in labels]
            assert len(boxes) >= 8
            for i, one in enumerate(boxes):
                assert fig.bbox.x0 <= one.x0 and one.x1 <= fig.bbox.x1 and fig.bbox.y0 <= one.y0
                assert not any(one.overlaps(other) for other in boxes[i + 1:]), [t.get_text() for t in labels]
            texts = [t.get_text().split("\n(n=")[0].split(" (n=")[0] for t in labels]
            for name in names:
                on_axis = any(t.replace("\n", "") == name for t in texts)
                keyed = any(f"{t}  {name}" in key.splitlines() for t in texts)
                assert on_axis or keyed, name
        assert png_bytes(fig)[:8] == b"\x89PNG\r\n\x1a\n"


def _cjk_font_installed(chars: str) -> bool:
    """Whether this machine has a font file (not Last Resort, whose glyphs are boxes) mapping every one of ``chars``."""
    from matplotlib import font_manager

    paths = {f.fname for f in font_manager.fontManager.ttflist} | set(font_manager.findSystemFonts())
    for path in paths:
        try:
            font = font_manager.get_font(path)
        except (OSError, RuntimeError, ValueError):
            continue
        if not font.family_name.startswith("Last Resort") and {ord(c) for c in chars} <= set(font.get_charmap()):
            return True
    return False


def _draw_with_warnings(d: dict) -> tuple[dict, list]:
    import warnings

    from vecmerge.report.plots import report_figures

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        figs = report_figures(d)
    assert set(figs) == {"totals", "subscores"}
    assert all(b[:8] == b"\x89PNG\r\n\x1a\n" for b in figs.values())
    return figs, [str(w.message) for w in caught]


CJK = {"names": ["模型甲", "模型乙"], "backbone": "基线", "metric": "总分", "sub": "理解能力"}


def test_chinese_names_are_drawn_with_a_cjk_font_where_one_is_installed():
    """Stranger finding: Chinese model and sub-score names drew as missing glyphs. With a CJK font on this machine
    (even one matplotlib's font cache predates), no missing-glyph warning; without one, one warning line, no crash."""
    d = _report(CJK["names"], CJK["backbone"], CJK["metric"], CJK["sub"])
    _, said = _draw_with_warnings(d)
    assert not any("missing from" in m for m in said)  # matplotlib's per-glyph warnings never reach the user
    if _cjk_font_installed("模型甲乙基线总分理解能力"):
        assert said == []
    else:
        assert len(said) == 1 and said[0].startswith("report plots: no installed font has a glyph for")


def test_without_a_cjk_font_the_figures_are_written_and_the_boxes_said_once(monkeypatch):
    from vecmerge.report import fonts

    monkeypatch.setattr(fonts, "glyph_font", lambda chars: None)
    d = _report(CJK["names"], CJK["backbone"], CJK["metric"], CJK["sub"])
    _, said = _draw_with_warnings(d)
    assert said == ["report plots: no installed font has a glyph for 基线总分模型甲乙理解能力: those characters show "
                    "as boxes in the figures (the Markdown and HTML text are unaffected); install a CJK font, e.g. "
                    "Noto Sans CJK (Debian: fonts-noto-cjk) or WenQuanYi (fonts-wqy-microhei)"]
    _, ascii_only = _draw_with_warnings(_report(["v58", "v59"]))
    assert ascii_only == []
