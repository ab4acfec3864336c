"""Rendering of ``vecmerge audit`` results: tables, JSON, CSV, markdown and a cosine heatmap.

Views of a ref/dir audit: ``module`` (one row per module), ``layer`` and ``type`` (modules pooled:
``cosine = sum inner / sqrt(sum ||ref||^2 sum ||dir||^2)`` over the group), and ``grid`` (layers x
module types, each cell the module cosine and its mark: ``+`` agree, ``x`` disagree, ``~`` chance).
Only this module (and cli.py) imports tabulate; matplotlib is imported lazily by ``plot``.
"""

from __future__ import annotations

import csv
import io
import math
import re
import statistics

from .errors import VecmergeError
from .report import g, table, to_json

TYPE_ORDER = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
SYMBOL = {"agree": "+", "disagree": "x", "chance": "~"}
LEGEND = "+ agree, x disagree (both beyond chance), ~ within the chance band"
_FMT = {"table": "simple", "markdown": "github"}


def _natural(name: str) -> list:
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]


def _type_rank(types) -> dict:
    seen = [t for t in TYPE_ORDER if t in types] + sorted(t for t in types if t not in TYPE_ORDER)
    return {t: i for i, t in enumerate(seen)}


def sort_rows(rows: list[dict], key: str) -> list[dict]:
    """Rows by ``module`` (natural order), ``cosine`` or ``inner`` (ascending: worst first), ``layer``, ``type``.

    Args:
        rows (list[dict]): audit rows. key (str): module | cosine | inner | layer | type.
    """
    rank = _type_rank({r["type"] for r in rows})
    lay = {r["module"]: (r["layer"] if r["layer"] is not None else math.inf) for r in rows}
    keys = {"module": lambda r: _natural(r["module"]), "cosine": lambda r: r["cosine"],
            "inner": lambda r: r["inner"], "layer": lambda r: (lay[r["module"]], rank[r["type"]]),
            "type": lambda r: (rank[r["type"]], lay[r["module"]])}
    if key not in keys:
        raise VecmergeError(f"--sort {key}: choose one of {', '.join(keys)}")
    return sorted(rows, key=keys[key])


def group(rows: list[dict], by: str) -> list[dict]:
    """Modules pooled by ``layer`` or ``type``: counts, pooled cosine and z, median/min module cosine.

    ``cosine = sum inner_m / sqrt(sum ||ref_m||^2 sum ||dir_m||^2)``,
    ``z = sum inner_m / sqrt(sum (||ref_m|| ||dir_m|| null_std_m)^2)`` over the group's modules.

    Args:
        rows (list[dict]): audit rows (with ``mark``). by (str): ``layer`` or ``type``.
    """
    order: dict = {}
    for r in rows:
        order.setdefault(r[by], []).append(r)
    out = []
    for key, rs in order.items():
        inner = sum(r["inner"] for r in rs)
        rn2, dn2 = sum(r["ref_norm"] ** 2 for r in rs), sum(r["dir_norm"] ** 2 for r in rs)
        var = sum((r["ref_norm"] * r["dir_norm"] * r.get("null_std", 0.0)) ** 2 for r in rs)
        cos = [r["cosine"] for r in rs]
        marks = [r["mark"] for r in rs]
        out.append({by: key, "modules": len(rs), "agree": marks.count("agree"), "disagree": marks.count("disagree"),
                    "chance": marks.count("chance"),
                    "agree_energy": sum(r["dir_norm"] ** 2 for r in rs if r["agree"]) / dn2 if dn2 > 0 else 0.0,
                    "inner": inner, "cosine": inner / math.sqrt(rn2 * dn2) if rn2 * dn2 > 0 else 0.0,
                    "z": inner / math.sqrt(var) if var > 0 else 0.0,
                    "cosine_median": statistics.median(cos), "cosine_min": min(cos)})
    return out


def grid(rows: list[dict]) -> dict:
    """``{layers, types, cosine, mark, unplaced}``: rows = layers, columns = module types (null where absent).

    Args:
        rows (list[dict]): audit rows. Modules without a layer index are listed in ``unplaced``.
    Returns:
        dict with ``cosine`` and ``mark`` as (len(layers), len(types)) nested lists.
    """
    placed = [r for r in rows if r["layer"] is not None]
    rank = _type_rank({r["type"] for r in placed})
    types = sorted(rank, key=rank.get)
    layers = sorted({r["layer"] for r in placed})
    li = {layer: i for i, layer in enumerate(layers)}
    cos = [[None] * len(types) for _ in layers]
    mark = [[None] * len(types) for _ in layers]
    for r in placed:
        cos[li[r["layer"]]][rank[r["type"]]] = r["cosine"]
        mark[li[r["layer"]]][rank[r["type"]]] = r["mark"]
    return {"layers": layers, "types": types, "cosine": cos, "mark": mark,
            "unplaced": [r["module"] for r in rows if r["layer"] is None]}


def _summary_lines(res: dict) -> list[str]:
    s = res["summary"]
    n = s["modules"]
    how = (f"sampled, {s['samples']} random rotations per module" if s["null_method"] == "sampled"
           else "analytic, 1.96/sqrt(out*in)")
    lines = [f"ref {res['ref']}  vs  dir {res['dir']}",
             f"{s['agree']}/{n} modules agree ({s['agree_energy']:.2%} of the direction's energy)",
             f"cosine: median {g(s['cosine_median'])}, min {g(s['cosine_min'])}, max {g(s['cosine_max'])}; "
             f"global {g(s['global_cosine'])} (z = {g(s['global_z'])})",
             f"chance: {s['chance']}/{n} modules within the null band ({how}, two-sided {s['level']:.0%}); "
             f"beyond it {s['agree_significant']} agree, {s['disagree_significant']} disagree",
             f"sign test: p = {s['binom_p']:.3g} for {s['agree']}/{n} (one-sided binomial vs 1/2, assumes independent "
             f"modules); non-chance modules only: p = {s['binom_p_significant']:.3g}",
             "disagreeing: " + (", ".join(s["disagreeing"]) if s["disagreeing"] else "none")]
    within = len(s["disagreeing"]) - s["disagree_significant"]
    if within:
        lines[-1] += f" ({within} of them within the chance band)"
    for label, ms in res.get("missing", {}).items():
        lines.append(f"missing in {label} (treated as zero): {len(ms)} module(s)")
    return lines


def _view(res: dict, by: str, sort: str) -> tuple[list, list]:
    """Headers and rows of the chosen view, as plain values."""
    rows = sort_rows(res["rows"], sort)
    if by == "module":
        head = ["module", "cosine", "inner", "ref_norm", "dir_norm", "z", "null_band", "mark"]
        return head, [[r[h] for h in head] for r in rows]
    if by in ("layer", "type"):
        groups = group(rows, by)
        rank = _type_rank({r["type"] for r in rows})
        natural = (lambda x: rank[x["type"]]) if by == "type" else (
            lambda x: math.inf if x["layer"] is None else x["layer"])
        groups.sort(key=(lambda x: x[sort]) if sort in ("cosine", "inner") else natural)
        head = [by, "modules", "agree", "disagree", "chance", "agree_energy", "cosine", "z", "cosine_median",
                "cosine_min"]
        return head, [[x[h] for h in head] for x in groups]
    if by == "grid":
        gr = grid(rows)
        head = ["layer", *gr["types"]]
        body = [[layer, *zip(gr["cosine"][i], gr["mark"][i])] for i, layer in enumerate(gr["layers"])]
        return head, body
    raise VecmergeError(f"--by {by}: choose one of module, layer, type, grid")


def _cell(x) -> str:
    if isinstance(x, tuple):
        return "" if x[0] is None else f"{x[0]:+.3g} {SYMBOL[x[1]]}"
    if isinstance(x, bool) or x is None or isinstance(x, (int, str)):
        return "-" if x is None else str(x)
    return g(x)


def _csv(head: list, body: list) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    if head and head[0] == "layer" and body and isinstance(body[0][1], tuple):  # grid: cosine and mark columns
        w.writerow(["layer", *[f"{t}{suf}" for t in head[1:] for suf in ("", "_mark")]])
        for row in body:
            w.writerow([row[0], *[v for c in row[1:] for v in (("", "") if c[0] is None else (repr(c[0]), c[1]))]])
    else:
        w.writerow(head)
        for row in body:
            w.writerow([repr(x) if isinstance(x, float) else x for x in row])
    return buf.getvalue().rstrip("\n")


def _render_pairwise(res: dict, fmt: str, sort: str) -> str:
    p = res["pairwise"]
    if fmt == "json":
        return to_json(res)
    pairs = sorted(res["pairs"], key=lambda x: x["cosine"]) if sort == "cosine" else res["pairs"]
    if fmt == "csv":
        head = ["a", "b", "cosine", "agree", "significant", "modules", "cosine_median"]
        return _csv(head, [[x[h] for h in head] for x in pairs])
    labels = p["labels"]
    cos = table([[a, *[f"{c:.4f}" for c in row]] for a, row in zip(labels, p["cosine"])], ["cosine", *labels],
                _FMT[fmt])
    agree = table([[a, *[f"{n}/{p['modules']} ({s})" for n, s in zip(row, srow)]]
                   for a, row, srow in zip(labels, p["agree"], p["significant"])], ["agree (beyond chance)", *labels],
                  _FMT[fmt])
    notes = [f"{p['modules']} modules; global cosine = sum_m <a_m, b_m> / (||a|| ||b||); agree = modules with a "
             "positive inner product, in brackets those beyond the analytic chance band"]
    for label, ms in res.get("missing", {}).items():
        notes.append(f"missing in {label} (treated as zero): {len(ms)} module(s)")
    return "\n\n".join([cos, agree, *notes])


def render(result: dict, by: str = "module", sort: str = "module", fmt: str = "table") -> str:
    """The audit as text: ``table`` (summary + view), ``markdown``, ``csv`` (the view only) or ``json``.

    Args:
        result (dict): from ``audit.audit_trajectories`` / ``audit_pairwise``. by (str): module | layer | type | grid.
        sort (str): module | cosine | inner | layer | type. fmt (str): table | json | csv | markdown.
    """
    if fmt not in ("table", "json", "csv", "markdown"):
        raise VecmergeError(f"--format {fmt}: choose one of table, json, csv, markdown")
    if result.get("kind") == "pairwise":
        return _render_pairwise(result, fmt, sort)
    head, body = _view(result, by, sort)
    if fmt == "json":
        out = dict(result, rows=sort_rows(result["rows"], sort), view=by)
        if by in ("layer", "type"):
            out[by + "s"] = [dict(zip(head, row)) for row in body]
        elif by == "grid":
            out["grid"] = grid(result["rows"])
        return to_json(out)
    if fmt == "csv":
        return _csv(head, body)
    text = table([[_cell(x) for x in row] for row in body], head, _FMT[fmt])
    lines = _summary_lines(result)
    if by == "grid":
        lines.insert(1, LEGEND)
    if fmt == "markdown":
        return "\n".join(f"- {x}" for x in lines) + "\n\n" + text
    return text + "\n\n" + "\n".join(lines)


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise VecmergeError("--plot needs matplotlib: pip install 'vecmerge[plot]'") from None
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def plot(result: dict, path) -> None:
    """Write a PNG heatmap: cosine by layer x module type (audit) or the pairwise cosine matrix.

    Diverging RdBu colours with symmetric limits centred on zero; disagreeing cells carry an ``x``,
    chance cells are hatched. Uses matplotlib's Agg backend.

    Args:
        result (dict): from ``audit.audit_trajectories`` / ``audit_pairwise``.
        path (str | Path | BinaryIO): the PNG to write, or a binary file to write it to (the CLI passes the
            staged file of ``safe_write.write_file``, which refuses inputs and replaces atomically).
    """
    plt = _pyplot()
    import numpy as np

    if result.get("kind") == "pairwise":
        p = result["pairwise"]
        data, xl, yl = np.array(p["cosine"], dtype=float), p["labels"], p["labels"]
        title, marks = f"global cosine, {p['modules']} modules", None
    else:
        gr = grid(result["rows"])
        if not gr["layers"]:
            raise VecmergeError("--plot: no audited module has a layer index to place on the grid; "
                                "use --by module --format csv to see them")
        data = np.array([[np.nan if c is None else c for c in row] for row in gr["cosine"]], dtype=float)
        xl, yl, marks = gr["types"], [str(x) for x in gr["layers"]], gr["mark"]
        s = result["summary"]
        title = (f"{result['dir']} vs {result['ref']}: {s['agree']}/{s['modules']} agree, "
                 f"{s['chance']} chance (hatched), x = disagree")
    finite = data[np.isfinite(data)]
    lim = float(np.abs(finite).max()) if finite.size and np.abs(finite).max() > 0 else 1.0
    fig, ax = plt.subplots(figsize=(1.6 + 0.9 * len(xl), 1.4 + 0.28 * len(yl)), dpi=100)
    im = ax.imshow(np.ma.masked_invalid(data), cmap="RdBu", vmin=-lim, vmax=lim, aspect="auto",
                   interpolation="nearest")
    ax.set_xticks(range(len(xl)), labels=xl, rotation=45, ha="right")
    ax.set_yticks(range(len(yl)), labels=yl)
    ax.set_ylabel("adapter" if marks is None else "layer")
    for i in range(len(yl)):
        for j in range(len(xl)):
            ink = "white" if np.isfinite(data[i, j]) and abs(data[i, j]) > 0.6 * lim else "black"
            if marks is None:
                ax.text(j, i, f"{data[i, j]:.3f}", ha="center", va="center", fontsize=8, color=ink)
            elif marks[i][j] == "disagree":
                ax.text(j, i, "x", ha="center", va="center", fontsize=9, fontweight="bold", color=ink)
            elif marks[i][j] == "chance":
                ax.add_patch(plt.Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, hatch="...", lw=0))
    fig.colorbar(im, ax=ax, label="cosine")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    try:
        fig.savefig(path, format="png")
    except OSError as e:
        if hasattr(path, "write"):  # a file the caller opened (``safe_write.write_file``) reports it
            raise
        raise VecmergeError(f"--plot {path}: cannot write ({e.strerror or e}); choose a writable path") from None
    finally:
        plt.close(fig)
