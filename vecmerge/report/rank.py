"""Text for held-out calibration (``evidence calibrate --loo``) and ``vecmerge rank``: the figures, then the verdict."""

from __future__ import annotations

from .format import g, table


def _ci(ci, digits: int = 3) -> str:
    return "-" if ci is None else f"[{ci[0]:.{digits}g}, {ci[1]:.{digits}g}]"


def _fit(d: dict) -> str:
    c = d["coefficients"]
    if c is None:
        return "no fit (too few models)"
    return f"{d['target']} ~ {c['intercept']:.6g}" + "".join(f" {c[p]:+.6g} x {p}" for p in d["proxies"])


def render_calibrate_loo(d: dict, *, models: bool = True) -> str:
    """``evidence calibrate --loo``: held-out predictions per model, their agreement with the target, the verdict.

    Args:
        d (dict): ``Calibration.to_dict()`` (held out). models (bool): include the per-model table.
    """
    conf = f"{d['confidence']:.0%}"
    direction = {True: "higher is better", False: "lower is better", None: "no direction recorded"}[
        d["target_higher_is_better"]]
    out = [f"calibrate {', '.join(d['proxies'])} against {d['target']} ({direction}), each of "
           f"{len(d['models'])} models left out of its own fit"]
    if models and d["predictions"] is not None:
        rows = [[r["model"], g(r["target"], 6), g(r["predicted"], 6), *(g(r[f"proxy:{p}"], 6) for p in d["proxies"])]
                for r in d["held_out"]]
        out.append(table(rows, ["model", f"{d['target']} (mean)", "held-out prediction", *d["proxies"]]))
    rows = [["fit on all models", _fit(d), ""],
            ["held-out Spearman rho", g(d["spearman"]), f"{conf} bootstrap CI {_ci(d['spearman_ci'])}, "
                                                        f"p {g(d['spearman_p'], 3)}"],
            ["held-out Kendall tau-b", g(d["kendall"]), f"{conf} bootstrap CI {_ci(d['kendall_ci'])}, "
                                                        f"p {g(d['kendall_p'], 3)}"],
            ["pairwise accuracy", g(d["pairwise_accuracy"]), f"over {d['pairs']} pairs of models"],
            ["held-out RMSE", g(d["rmse"]), f"in units of {d['target']}"],
            ["target noise ceiling", g(d["noise_ceiling"]),
             f"rho of one {d['target']} run vs the mean of the others ({d['noise_ceiling_models']} models)"]]
    out += [table(rows, ["", "", ""], "plain"),
            f"verdict: {d['verdict']} (needs {d['min_models']} models, and the held-out Spearman's lower bound >= "
            f"{d['min_spearman_low']:g} to rank candidates)"]
    out += [f"note: {r}" for r in d["reasons"]]
    return "\n".join(out)


def render_rank(d: dict) -> str:
    """``vecmerge rank``: the candidates ranked by the calibrated prediction, or listed with disaster flags."""
    proxies = d["proxies"]
    if d["mode"] == "ranking":
        head = f"rank {len(d['candidates'])} candidates by predicted {d['target']} from {', '.join(proxies)}"
    else:
        head = f"{len(d['candidates'])} candidates by {', '.join(proxies)}: disaster detector only, not a ranking"
    ranked = d["mode"] == "ranking"
    rows = []
    for r in d["rows"]:
        z = ", ".join("-" if r["z"][p] is None else f"{r['z'][p]:+.2f}" for p in proxies)
        pred = [g(r["predicted"], 6) + (" (extrapolated)" if r["extrapolated"] else "")] if ranked else []
        rows.append([*([r["rank"]] if ranked else []), r["candidate"], *(g(r["proxies"][p], 6) for p in proxies),
                     *pred, z, ", ".join(r["far_below"]) or ""])
    heads = [*(["rank"] if ranked else []), "candidate", *proxies, *([f"predicted {d['target']}"] if ranked else []),
             "modified z", "far below the others"]
    out = [head, table(rows, heads)]
    c = d["calibration"]
    if c is not None and d["mode"] == "ranking":
        out.append(f"the ranking's held-out accuracy over {len(c['models'])} past models: Spearman rho "
                   f"{g(c['spearman'])} {_ci(c['spearman_ci'])}, pairwise accuracy {g(c['pairwise_accuracy'])}, "
                   f"RMSE {g(c['rmse'])}")
    flagged = [r["candidate"] for r in d["rows"] if r["far_below"]]
    out.append(f"far below the others (modified z < -3.5): {', '.join(flagged) or 'none'}")
    out.append(f"verdict: {d['verdict']}")
    out += [f"note: {r}" for r in d["reasons"]]
    return "\n".join(out)
