"""Text and figure for ``vecmerge search``: the front and the top candidates, what was computed, the PNG."""

from __future__ import annotations

from .format import table
from .plots import png_bytes, pyplot


def _params(p: dict) -> str:
    return " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in p.items())


def _worst(c: dict, margins: dict) -> str | None:
    """The protected set closest to (or past) its own margin: the record's, else the lowest ``lower + M``."""
    if c.get("worst_set") is not None:
        return c["worst_set"]
    return min(c["protect"], key=lambda k: (c["protect"][k]["lower"] + margins.get(k, 0.0), k), default=None)


def _row(c: dict, rank: str, margins: dict) -> list:
    k = _worst(c, margins)
    f = c["protect"].get(k) if k is not None else None
    return [rank, c["sha256"][:12], _params(c["params"]), f"{c['objective']:+.4g}",
            "-" if f is None else f"{f['mean']:+.4g} ({k})",
            "-" if f is None else f"{f['lower']:+.4g} (>= -{margins.get(k, 0.0):g})", f"{c['step']:.4g}" if c["step"]
            else "-"]


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
    head = ["", "recipe hash", "parameters", "target gain", "protected set nearest its margin: mean",
            "its lower bound", "step"]
    m = d["margins"]
    if d["front"]:
        out += ["", "front (feasible, not dominated in target gain and the lower bound's distance to its margin)",
                table([_row(by_sha[s], str(i + 1), m) for i, s in enumerate(d["front"])], head)]
    if d["top"]:
        written = d.get("written") or {}
        out += ["", f"top {len(d['top'])} by target gain" + (" (written)" if written else ""),
                table([_row(by_sha[s], written.get(s, f"#{i + 1}"), m) for i, s in enumerate(d["top"])], head)]
    else:
        out += ["", "no feasible candidate: every one lowers a protected set past its margin (or steps too far); "
                    "widen --margin, lower --trust-max, or add --protect-energy choices"]
    return "\n".join(out)


def front_x(c: dict, margins: dict) -> float:
    """The plot's x, what decides feasibility: the lower bound of the set nearest its margin; with per-set margins,
    that bound's distance to its own margin (``lower + M``, >= 0 when feasible)."""
    k = _worst(c, margins)
    if k is None:
        return 0.0
    lower = c["protect"][k]["lower"]
    return lower if len(set(margins.values())) <= 1 else lower + margins.get(k, 0.0)


def plot_front(d: dict, f) -> None:
    """A PNG: every candidate's target gain against what decides its feasibility (``front_x``: the lower bound,
    not the mean), the feasible ones filled, the front joined, the margin drawn.

    Args:
        d (dict): the search record. f (BinaryIO): where the PNG goes.
    """
    plt = pyplot("--out-dir")
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    cands = [c for c in d["candidates"] if c["target"]]
    margins = d["margins"]
    for ok, style in ((False, dict(facecolors="none", edgecolors="tab:gray", label="infeasible")),
                      (True, dict(color="tab:blue", label="feasible"))):
        pts = [(front_x(c, margins), c["objective"]) for c in cands if c["feasible"] is ok]
        if pts:
            ax.scatter(*zip(*pts), s=18, **style)
    by_sha = {c["sha256"]: c for c in cands}
    front = sorted((front_x(by_sha[s], margins), by_sha[s]["objective"]) for s in d["front"] if s in by_sha)
    if front:
        ax.plot(*zip(*front), color="tab:red", lw=1.2, label="front")
    if len(set(margins.values())) <= 1:
        for m in set(margins.values()):
            ax.axvline(-m, color="tab:orange", ls="--", lw=1, label=f"-margin {m:g}")
        ax.set_xlabel("worst protected set's lower 95% bound of its mean loglik change (nats per item)")
    else:
        ax.axvline(0.0, color="tab:orange", ls="--", lw=1, label="its own -margin")
        ax.set_xlabel("protected set nearest its margin: lower 95% bound + its margin (nats per item; >= 0 holds)")
    ax.set_ylabel("target mean loglik change (nats per item)")
    ax.set_title(f"search {d['id']}: {len(cands)} candidates", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    f.write(png_bytes(fig))
