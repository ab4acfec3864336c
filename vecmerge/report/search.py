"""Text and figure for ``vecmerge search``: the front and the top candidates, what was computed, the PNG."""

from __future__ import annotations

from .format import table
from .plots import png_bytes, pyplot


def _params(p: dict) -> str:
    return " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in p.items())


def _row(c: dict, rank: str) -> list:
    worst = min(c["protect"].items(), key=lambda kv: kv[1]["lower"], default=(None, None))
    return [rank, c["sha256"][:12], _params(c["params"]), f"{c['objective']:+.4g}",
            "-" if worst[1] is None else f"{worst[1]['mean']:+.4g} ({worst[0]})",
            "-" if worst[1] is None else f"{worst[1]['lower']:+.4g}", f"{c['step']:.4g}" if c["step"] else "-"]


def render_search(d: dict) -> str:
    """The search's summary, its front (target gain against the worst protected change) and its top K.

    Args:
        d (dict): the search record (``search.engine.Outcome.to_dict()``, with ``written`` added).
    """
    by_sha = {c["sha256"]: c for c in d["candidates"]}
    feasible = sum(1 for c in by_sha.values() if c["feasible"])
    margins = ", ".join(f"{k} {v:g}" for k, v in d["margins"].items())
    out = [f"search {d['id']} ({d['sampler']}, seed {d['seed']}, budget {d['budget']}): {d['evaluated']} candidates "
           f"evaluated ({d['computed']} computed, {d['replayed']} replayed from the ledger), {feasible} feasible",
           f"objective: {d['objective']}",
           f"constraints: each protected set's {d['bound']} >= -margin ({margins}); step <= trust_max "
           f"{d['space']['trust_max']:g} of the backbone's norm"]
    plain = d.get("plain_dose")
    out.append("best plain dose (energy 0, no extras; the baseline): " + (
        "none feasible" if plain is None else f"trust {plain['trust']:.4g}, gain {plain['gain']:+.4g} "
                                              f"({plain['sha256'][:12]})"))
    head = ["", "recipe hash", "parameters", "target gain", "worst protected mean", "its lower bound", "step"]
    if d["front"]:
        out += ["", "front (feasible, not dominated in target gain and worst protected change)",
                table([_row(by_sha[s], str(i + 1)) for i, s in enumerate(d["front"])], head)]
    if d["top"]:
        written = d.get("written") or {}
        out += ["", f"top {len(d['top'])} by target gain" + (" (written)" if written else ""),
                table([_row(by_sha[s], written.get(s, f"#{i + 1}")) for i, s in enumerate(d["top"])], head)]
    else:
        out += ["", "no feasible candidate: every one lowers a protected set past its margin (or steps too far); "
                    "widen --margin, lower --trust-max, or add --protect-energy choices"]
    return "\n".join(out)


def plot_front(d: dict, f) -> None:
    """A PNG: every candidate's target gain against its worst protected change, the feasible ones filled, the
    front joined, the margin drawn.

    Args:
        d (dict): the search record. f (BinaryIO): where the PNG goes.
    """
    plt = pyplot("--out-dir")
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    cands = [c for c in d["candidates"] if c["target"]]
    for ok, style in ((False, dict(facecolors="none", edgecolors="tab:gray", label="infeasible")),
                      (True, dict(color="tab:blue", label="feasible"))):
        pts = [(c["worst_protected"], c["objective"]) for c in cands if c["feasible"] is ok]
        if pts:
            ax.scatter(*zip(*pts), s=18, **style)
    by_sha = {c["sha256"]: c for c in cands}
    front = sorted((by_sha[s]["worst_protected"], by_sha[s]["objective"]) for s in d["front"] if s in by_sha)
    if front:
        ax.plot(*zip(*front), color="tab:red", lw=1.2, label="front")
    for m in set(d["margins"].values()):
        ax.axvline(-m, color="tab:orange", ls="--", lw=1, label=f"-margin {m:g}")
    ax.set_xlabel("worst protected mean loglik change (nats per item)")
    ax.set_ylabel("target mean loglik change (nats per item)")
    ax.set_title(f"search {d['id']}: {len(cands)} candidates", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    f.write(png_bytes(fig))
