"""Text and figure for ``vecmerge probe``: the function-space table, the KL matrix, the map, what was computed."""

from __future__ import annotations

from ..errors import OutputError
from .format import g, table


def _f(x, digits: int = 4) -> str:
    return "-" if x is None else f"{x:.{digits}g}"


def render_probe(d: dict) -> str:
    """``probe``: per model its summary and map coordinates; KL(a || b) between every pair; informative items.

    Args:
        d (dict): ``ProbeResult.to_dict()`` (paths as shown to the user).
    """
    p, models, fmap = d["prompts"], d["models"], d["map"]
    tokens = next(iter(models.values()))["summary"]["tokens"] if models else 0
    out = [f"probe of {len(models)} adapter{'s' * (len(models) != 1)} on {p['path']} ({p['items']} items, {tokens} "
           f"target tokens, sha256 {p['sha256'][:12]}), teacher-forced, on {d['device']}"]
    rows = []
    for name, m in models.items():
        s, (x, y) = m["summary"], fmap["coords"][name]
        rows.append([name, _f(s["loglik"], 5), _f(s["loglik_per_token"], 4), _f(s["exact"], 3), _f(s["first_rank"], 4),
                     _f(s["top1"], 3), f"{x:+.3g}", f"{y:+.3g}"])
    ex = fmap["explained"]
    out.append(table(rows, ["model", "loglik/item", "loglik/token", "exact", "first rank", "top-1",
                            f"map x ({ex[0]:.0%})", f"map y ({ex[1]:.0%})"]))
    tasks = sorted({t for m in models.values() for t in m["summary"]["tasks"]})
    if tasks:
        body = [[name, *(_f(m["summary"]["tasks"][t]["loglik_per_token"], 4) if t in m["summary"]["tasks"] else "-"
                         for t in tasks)] for name, m in models.items()]
        out += ["", "loglik/token per task (sub-scores)", table(body, ["model", *tasks])]
    changed = {n: m["summary"]["changes"] for n, m in models.items() if m["summary"].get("changes")}
    if changed:
        cols = [*tasks, "all"]

        def cell(c):
            return "-" if c is None else f"{c['change']:+.4g}" + ("" if c["se"] is None else f" ± {c['se']:.2g}")

        body = [[n, *(cell(c["tasks"].get(t)) for t in cols)] for n, c in changed.items()]
        ref = next(iter(changed.values()))["from"]
        out += ["", f"change of loglik/item from {ref}, per task (paired mean ± standard error; what each step did to "
                    "each sub-score)", table(body, ["model", *cols])]
    if d["pairs"]:
        names = list(models)
        kl = {(r["a"], r["b"]): r["kl_ab"] for r in d["pairs"]} | {(r["b"], r["a"]): r["kl_ba"] for r in d["pairs"]}
        body = [[a, *("." if a == b else g(kl[(a, b)], 3) for b in names)] for a in names]
        out += ["", "KL(row || column) of the next-token distributions at the target positions (nats, mean over "
                    "positions, then items; JS in --json)", table(body, ["", *names])]
        top = [f"{r['item']} ({r['mean_js']:.3g})" for r in fmap["informative"][:5] if r["mean_js"] is not None]
        if top:
            out.append(f"items the models disagree on most (mean JS over pairs): {', '.join(top)}")
    forwards = sum(d["computed"]["forwards"].values())
    rec = d["recorded"]
    if not forwards:
        out.append("computed nothing: every number came from the ledger (same adapters, same prompt file)")
    else:
        out.append(f"computed {forwards} item forward passes in {d['computed']['batches']} batches; the rest came "
                   "from the ledger")
    if rec["ledger"] is None:
        out.append("recorded nothing (--no-record)")
    elif rec["records"] or rec["pair_records"]:
        out.append(f"recorded {rec['records']} records and {rec['pair_records']} pair records in {rec['ledger']} "
                   f"(metrics probe:{p['stem']}:loglik, :exact, :first_rank per item; whole-run means)")
    else:
        out.append(f"recorded nothing new in {rec['ledger']}")
    return "\n".join(out)


def plot_probe(d: dict, f) -> None:
    """A PNG: the models' log-likelihood vectors as a 2-D map (left) and their distance matrix (right).

    Args:
        d (dict): ``ProbeResult.to_dict()``. f (BinaryIO): where the PNG goes.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise OutputError("--plot needs matplotlib: pip install 'vecmerge[plot]'") from None
    fmap = d["map"]
    names = fmap["models"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.8), dpi=100)
    xs = [fmap["coords"][m][0] for m in names]
    ys = [fmap["coords"][m][1] for m in names]
    left.scatter(xs, ys, color="tab:blue")
    for m, x, y in zip(names, xs, ys):
        left.annotate(m, (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
    ex = fmap["explained"]
    left.set_xlabel(f"axis 1 ({ex[0]:.0%} of the spread)")
    left.set_ylabel(f"axis 2 ({ex[1]:.0%})")
    left.set_title("log-likelihood vectors (items centred over models)", fontsize=9)
    left.grid(alpha=0.3)
    dist = [[fmap["distance"][a][b] for b in names] for a in names]
    im = right.imshow(dist, cmap="viridis")
    right.set_xticks(range(len(names)), labels=names, rotation=90, fontsize=7)
    right.set_yticks(range(len(names)), labels=names, fontsize=7)
    right.set_title("RMS per-item loglik difference (nats)", fontsize=9)
    fig.colorbar(im, ax=right, fraction=0.046)
    fig.tight_layout()
    fig.savefig(f, format="png")
    plt.close(fig)
