"""Rendering of ``vecmerge audit`` results: tables, JSON, CSV, markdown and a cosine heatmap.

Views of a ref/dir audit: ``module`` (one row per module), ``layer`` and ``type`` (modules pooled:
``cosine = sum inner / sqrt(sum ||ref||^2 sum ||dir||^2)`` over the group), and ``grid`` (layers x
module types, each cell the module cosine and its mark: ``+`` agree beyond chance, ``x`` disagree
beyond chance, ``~`` chance, ``?`` missing in an input). Two agreements are told apart everywhere:
*same sign* (``<ref_m, dir_m> > 0``, JSON ``agree``) and agreement *beyond chance* (JSON
``agree_significant``). Module types are the shortest unambiguous suffixes (``attn.c_proj`` and
``mlp.c_proj`` stay apart); modules without a layer index (embedding LoRA, ``lm_head``) get a grid
row of their own, so no module is left out. The experts of a MoE parameter are one row each in the
``module`` view; their ``type`` is the parameter (gate_up_proj), so ``layer`` and ``type`` pool them,
and a grid cell holding several experts shows their pooled cosine, marked by the pooled z (``|z| < 1.96``:
chance).
Only this module (and cli.py) imports tabulate; matplotlib is imported lazily by ``plot``.
"""

from __future__ import annotations

import csv
import io
import math
import re
import statistics
from collections.abc import Mapping
from typing import Any

from ..analysis.audit import Z_CRIT
from ..errors import VecmergeError, few
from ..peft.format import type_path
from .format import g, table, to_json

TYPE_ORDER = ("q_proj", "k_proj", "v_proj", "o_proj", "gate", "gate_up_proj", "gate_proj", "up_proj", "down_proj")
SYMBOL = {"agree": "+", "disagree": "x", "chance": "~", "missing": "?", "zero": "0"}
NOT_COMPARED = ("missing", "zero")  # marks of rows counted neither as agreeing nor as disagreeing
LEGEND = "+ agree, x disagree (both beyond chance), ~ within the chance band"
MISSING_LEGEND = ", ? missing in an input, 0 zero on one side (not compared)"
EXPERT_LEGEND = ("cells of several experts: pooled cosine sum(inner) / sqrt(sum ||ref||^2 sum ||dir||^2), "
                 "~ when the pooled |z| < 1.96")
NO_LAYER = "no layer"  # the grid row of modules without a layer index
# Table headers of the pooled views (JSON and CSV keep the keys).
LABELS = {"agree": "same_sign", "agree_significant": "agree_beyond", "disagree_significant": "disagree_beyond",
          "not_compared": "missing"}
_FMT = {"table": "simple", "markdown": "github"}


def _natural(name: str) -> list:
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]


def _type_rank(rows) -> dict:
    """``{type label: column index}``: the usual projections first (q, k, v, o, gate, up, down), then the
    others in model order, then the types of modules without a layer index."""
    keys: dict = {}
    for r in rows:
        last = r["type"].rsplit(".", 1)[-1]
        k = (TYPE_ORDER.index(last) if last in TYPE_ORDER else len(TYPE_ORDER), r["layer"] is None,
             _natural(type_path(r["module"])))
        keys[r["type"]] = min(keys.get(r["type"], k), k)
    return {t: i for i, t in enumerate(sorted(keys, key=lambda t: keys[t]))}


def sort_rows(rows: list[dict], key: str) -> list[dict]:
    """Rows by ``module`` (natural order), ``cosine`` or ``inner`` (ascending: worst first), ``layer``, ``type``.

    Args:
        rows (list[dict]): audit rows. key (str): module | cosine | inner | layer | type.
    """
    rank = _type_rank(rows)
    lay = {r["module"]: (r["layer"] if r["layer"] is not None else math.inf) for r in rows}
    keys = {"module": lambda r: _natural(r["module"]), "cosine": lambda r: r["cosine"],
            "inner": lambda r: r["inner"], "layer": lambda r: (lay[r["module"]], rank[r["type"]]),
            "type": lambda r: (rank[r["type"]], lay[r["module"]])}
    if key not in keys:
        raise VecmergeError(f"--sort {key}: choose one of {', '.join(keys)}")
    return sorted(rows, key=keys[key])


def group(rows: list[dict], by: str) -> list[dict]:
    """Modules pooled by ``layer`` or ``type``: counts, pooled cosine and z, median/min module cosine.

    ``agree`` counts same-sign modules, ``agree_significant`` / ``disagree_significant`` those beyond
    the chance band, ``chance`` those within it, ``not_compared`` those missing in an input (left out of
    every count); ``cosine = sum inner_m / sqrt(sum ||ref_m||^2 sum ||dir_m||^2)``,
    ``z = sum inner_m / sqrt(sum (||ref_m|| ||dir_m|| null_std_m)^2)`` over the group's modules.

    Args:
        rows (list[dict]): audit rows (with ``mark``). by (str): ``layer`` or ``type``.
    """
    order: dict = {}
    for r in rows:
        order.setdefault(r[by], []).append(r)
    out = []
    for key, rs in order.items():
        counted = [r for r in rs if r["mark"] not in NOT_COMPARED]
        inner = sum(r["inner"] for r in rs)
        rn2, dn2 = sum(r["ref_norm"] ** 2 for r in rs), sum(r["dir_norm"] ** 2 for r in rs)
        var = sum((r["ref_norm"] * r["dir_norm"] * r.get("null_std", 0.0)) ** 2 for r in rs)
        cos = [r["cosine"] for r in counted] or [0.0]
        marks = [r["mark"] for r in counted]
        dn2c = sum(r["dir_norm"] ** 2 for r in counted)
        out.append({by: key, "modules": len(rs), "agree": sum(bool(r["agree"]) for r in counted),
                    "agree_significant": marks.count("agree"), "disagree_significant": marks.count("disagree"),
                    "chance": marks.count("chance"), "not_compared": len(rs) - len(counted),
                    "agree_energy": sum(r["dir_norm"] ** 2 for r in counted if r["agree"]) / dn2c if dn2c > 0 else 0.0,
                    "inner": inner, "cosine": inner / math.sqrt(rn2 * dn2) if rn2 * dn2 > 0 else 0.0,
                    "z": inner / math.sqrt(var) if var > 0 else 0.0,
                    "cosine_median": statistics.median(cos), "cosine_min": min(cos)})
    return out


def _pooled(rows: list[dict]) -> tuple[float, str]:
    """Cosine and mark of the rows in one grid cell (a MoE parameter's experts), pooled as in ``group``."""
    x = group(rows, "type")[0]
    return x["cosine"], "chance" if abs(x["z"]) < Z_CRIT else ("agree" if x["inner"] > 0 else "disagree")


def grid(rows: list[dict]) -> dict:
    """``{layers, types, cosine, mark, unplaced}``: rows = layers, columns = module types (null where absent).

    Modules without a layer index (embedding LoRA, ``lm_head``) fill one last row whose layer is
    ``None`` (``unplaced`` lists them), so every module has exactly one cell.

    Args:
        rows (list[dict]): audit rows.
    Returns:
        dict with ``cosine`` and ``mark`` as (len(layers), len(types)) nested lists; where a cell holds
        several rows (experts), their pooled cosine and mark, and ``pooled`` (the row count per cell).
    """
    rank = _type_rank(rows)
    types = sorted(rank, key=lambda t: rank[t])
    layers: list = sorted({r["layer"] for r in rows if r["layer"] is not None})
    if any(r["layer"] is None for r in rows):
        layers.append(None)
    li = {layer: i for i, layer in enumerate(layers)}
    cos = [[None] * len(types) for _ in layers]
    mark = [[None] * len(types) for _ in layers]
    cells: dict = {}
    for r in rows:
        cells.setdefault((li[r["layer"]], rank[r["type"]]), []).append(r)
    for (i, j), rs in cells.items():
        if len(rs) > 1 and not all("expert" in r for r in rs):  # module_types keeps this from happening
            raise VecmergeError(f"--by grid: {rs[0]['module']} and {rs[1]['module']} share layer {rs[0]['layer']} "
                                f"and type {rs[0]['type']}; use --by module")
        cos[i][j], mark[i][j] = (rs[0]["cosine"], rs[0]["mark"]) if len(rs) == 1 else _pooled(rs)
    out = {"layers": layers, "types": types, "cosine": cos, "mark": mark,
           "unplaced": [r["module"] for r in rows if r["layer"] is None]}
    if any(len(rs) > 1 for rs in cells.values()):
        counts = [[None] * len(types) for _ in layers]
        for (i, j), rs in cells.items():
            counts[i][j] = len(rs)
        out["pooled"] = counts
    return out


def _summary_lines(res: Mapping[str, Any]) -> list[str]:
    s = res["summary"]
    n, gone = s["modules"], s.get("not_compared", 0)
    k = n - gone
    how = (f"sampled, {s['samples']} random rotations per module" if s["null_method"] == "sampled"
           else "analytic, 1.96/sqrt(out*in)")
    of = f"{k}/{n} compared" if gone else f"{k}"
    lines = [f"ref {res['ref']}  vs  dir {res['dir']}",
             f"{s['agree']}/{k} modules agree in sign (<ref_m, dir_m> > 0), {s['agree_energy']:.2%} of the "
             "direction's energy",
             f"cosine: median {g(s['cosine_median'])}, min {g(s['cosine_min'])}, max {g(s['cosine_max'])}; "
             f"global {g(s['global_cosine'])} (z = {g(s['global_z'])})",
             f"chance: {s['chance']}/{of} modules within the null band ({how}, two-sided {s['level']:.0%}); "
             f"beyond chance {s['agree_significant']} agree, {s['disagree_significant']} disagree",
             f"sign test: p = {s['binom_p']:.3g} for {s['agree']}/{k} same-sign modules (one-sided binomial vs 1/2, "
             f"assumes independent modules); beyond-chance modules only: p = {s['binom_p_significant']:.3g}",
             "opposite sign: " + (few(s["disagreeing"]) if s["disagreeing"] else "none")]
    within = len(s["disagreeing"]) - s["disagree_significant"]
    if within:
        lines[-1] += f" ({within} of them within the chance band)"
    if s.get("experts"):
        x = s["experts"]
        lines.append(f"experts: {x['agree']}/{x['rows']} expert rows ({x['parameters']} parameters) agree; "
                     f"{x['chance']} within the chance band, beyond it {x['agree_significant']} agree, "
                     f"{x['disagree_significant']} disagree")
    zero = s.get("zero", 0)
    if gone - zero:
        lines.append(f"not compared: {gone - zero} module(s) missing in an input (read as zero by --allow-missing; "
                     "counted neither as agreeing nor as disagreeing)")
    if zero:
        lines.append(f"not compared: {zero} module(s) zero in the ref or the dir (no sign; counted neither as "
                     "agreeing nor as disagreeing): " + few([r["module"] for r in res["rows"] if r.get("zero")]))
    for label, ms in res.get("missing", {}).items():
        lines.append(f"missing in {label}: {len(ms)} module(s): {few(ms)}")
    if res.get("base_models_differ"):
        lines.append(_base_line(res))
    return lines


def _base_line(res: Mapping[str, Any]) -> str:
    groups: dict = {}
    for label, name in (res.get("base_models") or {}).items():
        groups.setdefault(str(name), []).append(label)
    return ("warning: the inputs declare different base models (" + "; ".join(
        f"{few(v)}: {k}" for k, v in groups.items()) + "); audited anyway (--allow-base-mismatch)")


def _sorted_groups(rows: list[dict], by: str, sort: str) -> list[dict]:
    groups = group(rows, by)
    rank = _type_rank(rows)
    natural = (lambda x: rank[x["type"]]) if by == "type" else (
        lambda x: math.inf if x["layer"] is None else x["layer"])
    groups.sort(key=(lambda x: x[sort]) if sort in ("cosine", "inner") else natural)
    return groups


def _view(res: Mapping[str, Any], by: str, sort: str) -> tuple[list, list]:
    """Keys and rows of the chosen view, as plain values."""
    rows = sort_rows(res["rows"], sort)
    if by == "module":
        head = ["module", "cosine", "inner", "ref_norm", "dir_norm", "z", "null_band", "mark"]
        return head, [[r[h] for h in head] for r in rows]
    if by in ("layer", "type"):
        groups = _sorted_groups(rows, by, sort)
        head = [by, "modules", "agree", "agree_significant", "disagree_significant", "chance",
                *(["not_compared"] if any(x["not_compared"] for x in groups) else []), "agree_energy", "cosine", "z",
                "cosine_median", "cosine_min"]
        return head, [[x[h] for h in head] for x in groups]
    if by == "grid":
        gr = grid(rows)
        head = ["layer", *gr["types"]]
        body = [[NO_LAYER if layer is None else layer, *zip(gr["cosine"][i], gr["mark"][i])]
                for i, layer in enumerate(gr["layers"])]
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


def _render_pairwise(res: Mapping[str, Any], fmt: str, sort: str) -> str:
    p = res["pairwise"]
    if fmt == "json":
        return to_json(res)
    pairs = sorted(res["pairs"], key=lambda x: x["cosine"]) if sort == "cosine" else res["pairs"]
    if fmt == "csv":
        head = ["a", "b", "cosine", "agree", "significant", "modules", "compared", "cosine_median"]
        return _csv(head, [[x.get(h) for h in head] for x in pairs])
    labels = p["labels"]
    compared = p.get("compared") or [[p["modules"]] * len(labels)] * len(labels)
    cos = table([[a, *[f"{c:.4f}" for c in row]] for a, row in zip(labels, p["cosine"])], ["cosine", *labels],
                _FMT[fmt])
    agree = table([[a, *[f"{n}/{k} ({s})" for n, s, k in zip(row, srow, krow)]]
                   for a, row, srow, krow in zip(labels, p["agree"], p["significant"], compared)],
                  ["same sign (beyond chance)", *labels], _FMT[fmt])
    notes = [f"{p['modules']} modules; global cosine = sum_m <a_m, b_m> / (||a|| ||b||); same sign = modules with a "
             "positive inner product, in brackets those also beyond the analytic chance band"]
    for label, ms in res.get("missing", {}).items():
        notes.append(f"missing in {label}: {len(ms)} module(s), read as zero in the cosine and not compared in the "
                     f"counts: {few(ms)}")
    if res.get("base_models_differ"):
        notes.append(_base_line(res))
    return "\n\n".join([cos, agree, *notes])


def render(result: Mapping[str, Any], by: str = "module", sort: str = "module", fmt: str = "table") -> str:
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
            out[by + "s"] = _sorted_groups(result["rows"], by, sort)
        elif by == "grid":
            out["grid"] = grid(result["rows"])
        return to_json(out)
    if fmt == "csv":
        return _csv(head, body)
    text = table([[_cell(x) for x in row] for row in body], [LABELS.get(h, h) for h in head], _FMT[fmt])
    lines = _summary_lines(result)
    if by in ("layer", "type"):
        lines.insert(1, "same_sign: modules with <ref_m, dir_m> > 0; agree_beyond / disagree_beyond: beyond the "
                        "chance band; chance: within it")
    if by == "grid":
        lines.insert(1, LEGEND + (MISSING_LEGEND if result["summary"].get("not_compared") else ""))
        if any("expert" in r for r in result["rows"]):
            lines.insert(2, EXPERT_LEGEND)
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


def heatmap_title(result: Mapping[str, Any]) -> str:
    """The heatmap's title, in the order of the summary: ``ref R vs dir D: n/k same sign, ...``."""
    s = result["summary"]
    k = s["modules"] - s.get("not_compared", 0)
    return (f"ref {result['ref']} vs dir {result['dir']}: {s['agree']}/{k} same sign; "
            f"{s['chance']} chance (hatched), x = disagree beyond chance")


def plot(result: Mapping[str, Any], path) -> None:
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
        xl, yl, marks = gr["types"], [NO_LAYER if x is None else str(x) for x in gr["layers"]], gr["mark"]
        title = heatmap_title(result)
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
            elif marks[i][j] in NOT_COMPARED:
                ax.text(j, i, SYMBOL[marks[i][j]], ha="center", va="center", fontsize=9, color=ink)
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
