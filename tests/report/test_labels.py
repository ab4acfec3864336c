"""Tick labels that fit: labels that fit are left as given; overlapping ones are wrapped (measured, not guessed)."""

from __future__ import annotations

import pytest

pytest.importorskip("matplotlib")

from vecmerge.report.labels import fit_labels, overlaps  # noqa: E402
from vecmerge.report.plots import pyplot  # noqa: E402


def _panel(labels, width=6.0):
    fig, ax = pyplot().subplots(figsize=(width, 3))
    ax.plot(range(len(labels)), range(len(labels)))
    ax.set_xticks(range(len(labels)), labels=labels, fontsize=8)
    return fig, ax


def test_labels_that_fit_are_left_exactly_as_given():
    labels = ["v51\n(n=5)", "v58\n(n=3)", "v59\n(n=1)"]
    fig, ax = _panel(labels)
    fit_labels(fig, [(ax, labels)])
    assert [t.get_text() for t in ax.get_xticklabels()] == labels and not fig.texts


def test_overlapping_names_are_wrapped_unrotated_and_then_fit():
    labels = [f"{c * 3}-candidate-with-a-long-name\n(n=3)" for c in "abc"]
    fig, ax = _panel(labels, width=4.0)
    fig.tight_layout()
    assert overlaps(fig, ax)
    fit_labels(fig, [(ax, labels)])
    assert not overlaps(fig, ax)
    texts = [t.get_text() for t in ax.get_xticklabels()]
    assert all(t.endswith("\n(n=3)") and t.count("\n") >= 2 for t in texts)  # wrapped over several lines
    assert [t.rsplit("\n", 1)[0].replace("\n", "") for t in texts] == [x.split("\n")[0] for x in labels]
    assert not fig.texts  # wrapping sufficed: no key
