"""Tick labels that fit: long model names never overlap on a panel (measured with the renderer, not guessed).

    check     after ``tight_layout``, each panel's x tick labels' window extents, left to right; two overlap
              when one's right edge comes within 4 px of the next one's left edge
    wrap      labels that overlap: each name wrapped, unrotated, to 20, 14, then 10 characters a line (long
              words broken, at most 4 lines), the ``(n=...)`` line kept below it
    key       still overlapping: every overlapping panel's names replaced by numbers (``1``, ``2``, ... in the
              order first drawn; names of <= 6 characters kept; then single-line, rotated 90 degrees, if even
              that overlaps) and a key under the figure, ``1  full name``, for which the figure grows taller
    nothing   labels that fit are left exactly as drawn
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence

__all__ = ["overlaps", "fit_labels", "WRAP_WIDTHS"]

WRAP_WIDTHS = (20, 14, 10)
MAX_LINES = 4
GAP = 4  # px between two labels, at 100 dpi
SHORT = 6  # a name this short keeps its place on the axis when the others are keyed


def overlaps(fig, ax, drawn: bool = False) -> bool:
    """Whether two of ``ax``'s visible x tick labels overlap in the figure as laid out now (module docstring).

    Args:
        fig: the Figure. ax: its Axes. drawn (bool): the figure was drawn since its last change (no draw here).
    """
    if not drawn:
        fig.draw_without_rendering()
    renderer = fig.canvas.get_renderer()
    boxes = sorted((t.get_window_extent(renderer) for t in ax.get_xticklabels() if t.get_visible() and t.get_text()),
                   key=lambda b: b.x0)
    return any(a.x1 + GAP > b.x0 for a, b in zip(boxes, boxes[1:]))


def _bad(fig, panels: Sequence[tuple]) -> list[tuple]:
    """The panels whose labels overlap, after one layout and one draw of the figure."""
    fig.tight_layout()
    fig.draw_without_rendering()
    return [(ax, labels) for ax, labels in panels if overlaps(fig, ax, drawn=True)]


def _split(label: str) -> tuple[str, str]:
    """A point's label as (name, the rest: ``(n=3)`` and an env line), whether drawn on lines or on one."""
    name, sep, rest = label.partition("\n")
    if sep:
        return name, rest
    head, sep, tail = label.rpartition(" (n=")
    return (head, f"(n={tail}") if sep else (label, "")


def _wrap(name: str, width: int) -> list[str]:
    return textwrap.wrap(name, width, break_long_words=True, break_on_hyphens=True) or [name]


def _set(ax, labels: Sequence[str], rotation: float = 0) -> None:
    ax.set_xticks(range(len(labels)), labels=list(labels), rotation=rotation, ha="center", fontsize=7)


def fit_labels(fig, panels: Sequence[tuple]) -> None:
    """Make every panel's x tick labels fit (module docstring), then lay the figure out.

    Args:
        fig: a matplotlib Figure. panels (Sequence[tuple]): ``(ax, labels)`` per panel, ``labels`` the points'
            labels as ``interval_panel`` was given them (``name\\n(n=3)``).
    """
    bad = _bad(fig, panels)
    if not bad:
        return
    parts = {id(ax): [_split(x) for x in labels] for ax, labels in bad}
    left = bad
    for width in WRAP_WIDTHS:
        wrapped = {id(ax): [_wrap(name, width) for name, _ in parts[id(ax)]] for ax, _ in left}
        if any(max(map(len, w)) > MAX_LINES for w in wrapped.values()):
            continue
        for ax, _ in left:
            _set(ax, ["\n".join(w + ([rest] if rest else [])) for w, (_, rest) in zip(wrapped[id(ax)], parts[id(ax)])])
        left = _bad(fig, left)
        if not left:
            return
    numbers: dict[str, str] = {}  # every panel that overlapped is keyed, so one name has one number throughout
    for ax, _ in bad:
        for name, _ in parts[id(ax)]:
            if name not in numbers:
                numbers[name] = name if len(name) <= SHORT else str(sum(len(n) > SHORT for n in numbers) + 1)
    for ax, _ in bad:
        _set(ax, [numbers[name] + (f"\n{rest}" if rest else "") for name, rest in parts[id(ax)]])
    _key(fig, {n: k for n, k in numbers.items() if n != k})
    if any(overlaps(fig, ax, drawn=True) for ax, _ in bad):
        for ax, _ in bad:
            _set(ax, [numbers[name] + (f" {rest}" if rest else "") for name, rest in parts[id(ax)]], rotation=90)
        _key(fig, {}, again=True)


def _key(fig, numbers: dict[str, str], again: bool = False) -> None:
    """The key under the figure (``1  full name`` a line), the panels laid out above it; the figure grows by the
    key's height the first time."""
    text = next((t for t in fig.texts if t.get_gid() == "label-key"), None)
    if text is None:
        text = fig.text(0.01, 0.005, "\n".join(f"{k}  {name}" for name, k in numbers.items()), fontsize=7,
                        va="bottom", ha="left", gid="label-key")
    fig.draw_without_rendering()
    height = text.get_window_extent(fig.canvas.get_renderer()).height / fig.dpi
    if not again:
        w, h = fig.get_size_inches()
        fig.set_size_inches(w, h + height)
    fig.tight_layout(rect=(0, (height + 0.1) / fig.get_size_inches()[1], 1, 1))
    fig.draw_without_rendering()
