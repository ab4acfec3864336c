"""``vecmerge search``'s table and PNG from a search record."""

from __future__ import annotations

import io

import pytest

from vecmerge.report.search import front_x, plot_front, render_search


def _cand(sha, gain, worst, lower, feasible, **params):
    return {"sha256": sha * 64, "params": params, "objective": gain, "worst_protected": worst, "feasible": feasible,
            "target": {"t": {"mean": gain}}, "protect": {"p": {"mean": worst, "lower": lower}}, "step": 0.05}


def _record():
    cands = [_cand("a", 2.0, -0.01, -0.02, True, trust=0.05, energy=0.9),
             _cand("b", 3.0, -0.5, -0.7, False, trust=0.1, energy=0.0)]
    return {"id": "abc", "sampler": "grid", "seed": 0, "budget": 2, "evaluated": 2, "computed": 1, "replayed": 1,
            "objective": "the target's mean", "bound": "lower one-sided 95% bound", "margins": {"p": 0.05},
            "space": {"trust_max": 0.1}, "candidates": cands, "front": ["a" * 64], "top": ["a" * 64],
            "written": {"a" * 64: "out/top1"}}


def test_the_table_names_the_bound_the_front_and_the_written_candidates():
    text = render_search(_record())
    assert "2 candidates evaluated (1 computed, 1 replayed from the ledger), 1 feasible" in text
    assert "lower one-sided 95% bound >= -margin (p 0.05)" in text
    assert "out/top1" in text and "trust=0.05 energy=0.9" in text and "+2" in text and "-0.02" in text
    empty = {**_record(), "front": [], "top": []}
    assert "no feasible candidate" in render_search(empty)


def test_the_png_is_written():
    buf = io.BytesIO()
    plot_front(_record(), buf)
    assert buf.getvalue().startswith(b"\x89PNG")


def test_the_plot_and_the_table_use_what_decides_the_set_nearest_its_own_margin():
    """Issue: the plot's x was the mean while feasibility uses the lower bound; with per-set margins the "worst
    protected" set must be the one closest to its own margin, not the lowest mean."""
    c = {**_cand("c", 2.0, -0.3, -0.4, True), "protect": {"p": {"mean": -0.3, "lower": -0.4},
                                                         "q": {"mean": -0.01, "lower": -0.04}}}
    assert front_x(c, {"p": 0.05}) == -0.4  # one margin: the lower bound itself (not the mean -0.3)
    assert front_x(c, {"p": 1.0, "q": 0.05}) == pytest.approx(0.01)  # q is nearest: -0.04 + 0.05 (p: 0.6 left)
    rec = {**_record(), "margins": {"p": 1.0, "q": 0.05}, "candidates": [c], "front": [c["sha256"]], "top": []}
    row = next(line for line in render_search(rec).splitlines() if line.lstrip().startswith("1 "))
    assert "(q)" in row and "-0.04 (>= -0.05)" in row, row
    buf = io.BytesIO()
    plot_front(rec, buf)
    assert buf.getvalue().startswith(b"\x89PNG")


def test_the_text_names_the_best_plain_dose_the_baseline():
    rec = {**_record(), "plain_dose": {"sha256": "c" * 64, "trust": 0.0301, "gain": 0.292, "worst_protected": -0.01}}
    assert "best plain dose (energy 0, no extras; the baseline): trust 0.0301, gain +0.292 (cccccccccccc)" in \
        render_search(rec)
    assert "best plain dose (energy 0, no extras; the baseline): none feasible" in render_search(_record())
