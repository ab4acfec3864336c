"""``vecmerge search``'s table and PNG from a search record."""

from __future__ import annotations

import io

from vecmerge.report.search import plot_front, render_search


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
