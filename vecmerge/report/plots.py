"""Figures a person can read: means with their t intervals, each panel zoomed to its own data, sub-scores as
small multiples. Only ``report/`` imports matplotlib, lazily (``pip install 'vecmerge[plot]'``).

    zoom      the y range is the data's: the models with an interval (>= 2 runs) set the core, single runs within
              one core width of it join it; a value farther out is drawn as a triangle at the panel's edge with
              its value written, so one far model (v45's 0.4925) never flattens differences of 0.01-0.03
    points    filled with an error bar: mean and its t interval; hollow, no bar: a single run (no spread)
    ref       a dashed line (and a band: its interval) for the backbone, where a figure has one

Used by ``evidence show --plot`` (``show_figure``) and ``vecmerge report`` (``report_figures``).
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence

from ..errors import OutputError
from .fonts import fonts_for
from .labels import fit_labels

__all__ = ["pyplot", "Point", "limits", "interval_panel", "show_figure", "show_fig", "report_figures", "report_figs",
           "png_bytes"]

Point = dict  # {"label", "mean", "low", "high"} (low/high None: a single run), JSON-ready


def pyplot(flag: str = "--plot"):
    """matplotlib.pyplot on the Agg backend, or OutputError naming the extra to install."""
    try:
        import matplotlib

        matplotlib.use("Agg", force=True)
        import matplotlib.pyplot as plt
    except ImportError:
        raise OutputError(f"{flag} needs matplotlib: pip install 'vecmerge[plot]'") from None
    return plt


def limits(points: Sequence[Point], extra: Sequence[float] = ()) -> tuple[float, float, list[int]]:
    """The y range of a panel and the indices of the points drawn off-scale (module docstring, "zoom").

    Args:
        points (Sequence[Point]): the panel's points. extra (Sequence[float]): values that must show (a
            reference line and its band, zero on a panel of differences).
    """
    spans = [(p["low"], p["high"]) for p in points if p.get("low") is not None]
    if spans:
        lo, hi = min(s[0] for s in spans), max(s[1] for s in spans)
        for v in extra:
            lo, hi = min(lo, v), max(hi, v)
        width = hi - lo
        far = [] if width <= 1e-9 * max(abs(lo), abs(hi), 1.0) else [  # zero spread: no core to zoom to
            i for i, p in enumerate(points) if p.get("low") is None and not lo - width <= p["mean"] <= hi + width]
    else:
        far = []
    kept = [p for i, p in enumerate(points) if i not in far]
    values = [v for p in kept for v in (p["mean"], p.get("low"), p.get("high")) if v is not None] + list(extra)
    lo, hi = min(values), max(values)
    pad = (hi - lo) * 0.12 if hi > lo else max(abs(hi) * 0.01, 1e-3)
    return lo - pad, hi + pad, far


def interval_panel(ax, points: Sequence[Point], *, title: str, ylabel: str = "", ref: Point | None = None,
                   zero: bool = False) -> None:
    """One panel: each point's mean and interval, zoomed (``limits``), a reference band or a zero line.

    Args:
        ax: a matplotlib Axes. points (Sequence[Point]): left to right. title, ylabel (str): the panel's words.
        ref (Point | None): the backbone: a dashed line at its mean, a band over its interval.
        zero (bool): draw a line at 0 (a panel of differences) and keep it in range.
    """
    extra = [] if ref is None else [v for v in (ref["mean"], ref.get("low"), ref.get("high")) if v is not None]
    lo, hi, far = limits(points, extra + ([0.0] if zero else []))
    if ref is not None:
        ax.axhline(ref["mean"], color="tab:gray", ls="--", lw=1, label=ref.get("legend", ref["label"]))
        if ref.get("low") is not None:
            ax.axhspan(ref["low"], ref["high"], color="tab:gray", alpha=0.15, lw=0)
        ax.legend(loc="best", fontsize=7, frameon=False)
    if zero:
        ax.axhline(0.0, color="black", lw=0.8)
    for i, p in enumerate(points):
        if i in far:
            edge = hi if p["mean"] > hi else lo
            ax.plot([i], [edge], "^" if p["mean"] > hi else "v", color="tab:red", clip_on=False)
            ax.annotate(f"{p['mean']:.4g}", (i, edge), textcoords="offset points",
                        xytext=(0, -12 if p["mean"] > hi else 6), ha="center", fontsize=7, color="tab:red")
        elif p.get("low") is None:
            ax.plot([i], [p["mean"]], "o", mfc="white", color="tab:orange", ms=6)
        else:
            ax.errorbar([i], [p["mean"]], yerr=[[p["mean"] - p["low"]], [p["high"] - p["mean"]]], fmt="o",
                        capsize=4, color="tab:blue", ms=5)
        if i not in far and len(points) <= 12:  # the value beside its point: read, not estimated from the axis
            ax.annotate(f"{p['mean']:.4g}", (i, p["mean"]), textcoords="offset points", xytext=(7, -3), fontsize=7)
    ax.set_ylim(lo, hi)
    ax.set_xlim(-0.6, len(points) - 0.4)
    many = len(points) > 8
    labels = [p["label"].replace("\n", " ") if many else p["label"] for p in points]
    ax.set_xticks(range(len(points)), labels=labels, rotation=45 if many else 0,
                  ha="right" if many else "center", fontsize=7 if many else 8)
    ax.set_title(title, fontsize=9)
    ax.set_ylabel(ylabel, fontsize=8)
    ax.tick_params(axis="y", labelsize=7)
    ax.grid(axis="y", alpha=0.3)


def png_bytes(fig) -> bytes:
    """The figure as PNG bytes (100 dpi), and the figure closed."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    pyplot().close(fig)
    return buf.getvalue()


def _point(s: dict, several_envs: bool) -> Point:
    label = f"{s['model']}\n(n={s['n']})" + (f"\nenv {s['env'][:6]}" if several_envs and s.get("env") else "")
    return {"label": label, "mean": s["mean"], "low": None if s["single_run"] else s["ci_low"],
            "high": None if s["single_run"] else s["ci_high"]}


def show_figure(d: dict, f) -> None:
    """``evidence show --plot``: ``show_fig``'s figure as a PNG written to ``f`` (a binary file object), drawn with
    a font that has every glyph of its names where one is installed (``fonts.fonts_for``)."""
    texts = [t for s in d["summaries"] for t in (s["model"], s["metric"], s["sub"] or "")]
    with fonts_for(texts, "--plot"):
        f.write(png_bytes(show_fig(d)))


def show_fig(d: dict):
    """The figure of ``evidence show --plot``: one wide panel per metric, then its sub-scores as small multiples
    (4 a row), each panel zoomed to its own data (module docstring).

    Args:
        d (dict): ``commands.summaries.show``'s result.
    """
    plt = pyplot()
    rows = d["summaries"]
    metrics = list(dict.fromkeys(s["metric"] for s in rows if s["sub"] is None))
    if not metrics:
        raise OutputError("--plot: no whole-run records to draw")
    subs = [(m, k) for m in metrics for k in dict.fromkeys(s["sub"] for s in rows if s["metric"] == m and s["sub"])]
    ncols = min(4, max(len(subs), 1))
    nsub_rows = math.ceil(len(subs) / ncols)
    n_models = max(len([s for s in rows if s["metric"] == m and s["sub"] is None]) for m in metrics)
    width = min(max(6.5, 0.5 * n_models + 2.0), 16.0)
    fig = plt.figure(figsize=(width, 3.4 * len(metrics) + 2.8 * nsub_rows))
    grid = fig.add_gridspec(len(metrics) + nsub_rows, ncols)
    conf = f"{rows[0]['confidence']:.0%}"
    for i, metric in enumerate(metrics):
        mine = [s for s in rows if s["metric"] == metric and s["sub"] is None]
        several = len({s.get("env") for s in mine}) > 1
        interval_panel(fig.add_subplot(grid[i, :]), [_point(s, several) for s in mine], ylabel=metric,
                       title=f"{metric}: mean and {conf} t interval per model (hollow: a single run; "
                             "red triangle: off this scale, value written)")
    for j, (metric, key) in enumerate(subs):
        mine = [s for s in rows if s["metric"] == metric and s["sub"] == key]
        several = len({s.get("env") for s in mine}) > 1
        ax = fig.add_subplot(grid[len(metrics) + j // ncols, j % ncols])
        interval_panel(ax, [_point(s, several) for s in mine], title=f"{metric} / {key}")
    fig.tight_layout()
    return fig


def _summary_point(label: str, s: dict) -> Point:
    return {"label": f"{label}\n(n={s['n']})", "mean": s["mean"], "low": None if s["single_run"] else s["ci_low"],
            "high": None if s["single_run"] else s["ci_high"]}


def _diff_point(c: dict) -> Point:
    cmp = c["comparison"]
    t = cmp.get(cmp["decided_by"]) if cmp["decided_by"] else None
    if t is None:
        return {"label": c["name"], "mean": cmp["a_summary"]["mean"] - cmp["b_summary"]["mean"], "low": None,
                "high": None}
    return {"label": c["name"], "mean": t["diff"], "low": t["ci_low"], "high": t["ci_high"]}


def report_figures(d: dict) -> dict[str, bytes]:
    """``vecmerge report``'s figures (``report_figs``) as PNG bytes, drawn with a font that has every glyph of
    their names where one is installed (``fonts.fonts_for``: else one warning line, and boxes).

    Args:
        d (dict): ``commands.report.gather``'s result.
    """
    with fonts_for(_report_texts(d), "report plots"):
        return {key: png_bytes(fig) for key, fig in report_figs(d).items()}


def _report_texts(d: dict) -> list[str]:
    """Every name the report's figures write: the models, the backbone, the metric, the sub-scores."""
    keys = [k for c in d["candidates"] for k in ((c["comparison"].get("subscores") or {}).get("subscores") or {})]
    return [d["backbone"], d["metric"], *(c["name"] for c in d["candidates"]), *keys]


def report_figs(d: dict) -> dict:
    """``vecmerge report``'s figures: ``totals`` (the models' means with intervals beside each candidate minus the
    backbone with its test's interval) and, where sub-scores exist, ``subscores`` (one small panel per sub-score,
    the backbone dashed); every panel's labels fitted (``labels.fit_labels``).

    Args:
        d (dict): ``commands.report.gather``'s result.
    """
    plt = pyplot("report")
    cands, bb, metric = d["candidates"], d["backbone"], d["metric"]
    conf = f"{d['confidence']:.0%}"
    base = _summary_point(bb, cands[0]["comparison"]["b_summary"])
    width = min(max(9.0, 1.1 * len(cands) + 6.0), 16.0)
    fig, (left, right) = plt.subplots(1, 2, figsize=(width, 3.8), width_ratios=[len(cands) + 1, len(cands)])
    totals = [base, *[_summary_point(c["name"], c["comparison"]["a_summary"]) for c in cands]]
    diffs = [_diff_point(c) for c in cands]
    interval_panel(left, totals, title=f"{metric}: mean and {conf} t interval (hollow: one run)", ylabel=metric,
                   ref={**base, "legend": f"{bb} (backbone): mean, band: its interval"})
    interval_panel(right, diffs, zero=True,
                   title=f"candidate minus {bb}, {conf} interval of the test", ylabel=f"difference from {bb}")
    fit_labels(fig, [(left, [p["label"] for p in totals]), (right, [p["label"] for p in diffs])])
    out = {"totals": fig}
    rows: dict = {}
    for c in cands:
        for key, r in ((c["comparison"].get("subscores") or {}).get("subscores") or {}).items():
            panel = rows.setdefault(key, {"ref": r["b_summary"], "points": []})
            if r["a_summary"] is not None:
                panel["points"].append(_summary_point(c["name"], r["a_summary"]))
    if rows:
        ncols = min(4, len(rows))
        nrows = math.ceil(len(rows) / ncols)
        fig, axes = plt.subplots(nrows, ncols, figsize=(3.4 * ncols + 0.6, 2.9 * nrows), squeeze=False)
        panels = []
        for ax, (key, panel) in zip(axes.flat, rows.items()):
            ref = None if panel["ref"] is None else {**_summary_point(bb, panel["ref"]), "legend": f"{bb} (backbone)"}
            points = ([] if ref is None else [ref]) + panel["points"]
            interval_panel(ax, points, title=key, ref=ref)
            panels.append((ax, [p["label"] for p in points]))
        for ax in list(axes.flat)[len(rows):]:
            ax.set_visible(False)
        fit_labels(fig, panels)
        out["subscores"] = fig
    return out
