"""The protected-step frontier as one PNG: target gain against the worst protected drop, per energy, across trusts."""

from __future__ import annotations

from pathlib import Path

from ..errors import OutputError


def frontier_png(rows: list[dict], path, label: str = "trust") -> Path:
    """Write the frontier plot: one line per series (plain, and each energy E), one point per trust.

    ``x = max_k drop_k`` (the worst protected task's fall in mean log-likelihood), ``y = gain`` (the target's rise).

    Args:
        rows (list[dict]): ``{"trust": float, "energy": float | None (plain), "gain": float, "drops": [float, ...]}``.
        path (str | Path): the PNG to write. label (str): what the points' labels (``trust``) are, for the title.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise OutputError("the frontier plot needs matplotlib: pip install 'vecmerge[plot]'") from None
    series: dict = {}
    for r in rows:
        series.setdefault(r["energy"], []).append(r)
    fig, ax = plt.subplots(figsize=(6.4, 4.6), dpi=100)
    for energy, pts in sorted(series.items(), key=lambda kv: -1.0 if kv[0] is None else kv[0]):
        pts = sorted(pts, key=lambda r: r["trust"])
        xs, ys = [max(r["drops"]) for r in pts], [r["gain"] for r in pts]
        ax.plot(xs, ys, marker="o", color="black" if energy is None else None,
                label="plain step" if energy is None else f"protected, E {energy:g}")
        for r, x, y in zip(pts, xs, ys):
            ax.annotate(f"{r['trust']:g}", (x, y), textcoords="offset points", xytext=(3, 3), fontsize=7)
    ax.set_xscale("symlog", linthresh=0.01)
    ax.set_xlabel("worst protected task's drop in mean log-likelihood (symlog)")
    ax.set_ylabel("target's gain in mean log-likelihood")
    ax.set_title(f"protected steps: target gain against protected drop (labels: {label})", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, format="png")
    plt.close(fig)
    return path
