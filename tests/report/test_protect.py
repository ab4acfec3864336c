"""report/protect.py: the frontier PNG is written, one line per series, one point per trust."""

from __future__ import annotations

import pytest

from vecmerge.report.protect import frontier_png


def test_frontier_png_draws_one_line_per_series(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    drawn = []
    real = plt.Axes.plot
    monkeypatch.setattr(plt.Axes, "plot", lambda self, x, y, **k: drawn.append((list(x), list(y), k["label"]))
                        or real(self, x, y, **k))
    rows = [{"trust": t, "energy": e, "gain": g, "drops": d} for t, e, g, d in
            [(0.1, None, 3.0, [0.5, 0.1]), (0.2, None, 6.0, [2.0, 1.0]), (0.1, 0.9, 1.0, [0.01, 0.0]),
             (0.2, 0.9, 2.0, [0.1, 0.2])]]
    path = frontier_png(rows, tmp_path / "f.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert drawn == [([0.5, 2.0], [3.0, 6.0], "plain step"), ([0.01, 0.2], [1.0, 2.0], "protected, E 0.9")]
