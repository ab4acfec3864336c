"""``vecmerge report``'s content once, as blocks that ``markdown`` and ``html`` both render (so the two never differ).

A block is a tuple: ``("h", level, text)``, ``("p", text)``, ``("ul", [text, ...])``,
``("table", headers, rows)`` or ``("fig", key, caption)`` (a figure of ``plots.report_figures``; the HTML shows it
inline, the Markdown names the HTML file). Numbers: 6 significant digits for means, 5 for differences and
intervals, 3 for p-values, as ``report/evidence.py`` prints them.
"""

from __future__ import annotations

__all__ = ["blocks", "test_name", "noise_words"]


def _m(x) -> str:
    return "-" if x is None else f"{x:.6g}"


def _d(x) -> str:
    return "-" if x is None else f"{x:+.5g}"


def _p(x) -> str:
    return "-" if x is None else f"{x:.3g}"


def _ci(lo, hi) -> str:
    return "-" if lo is None else f"[{lo:.5g}, {hi:.5g}]"


def test_name(kind: str, t: dict) -> str:
    """A test as the report names it: ``welch``, or with how its p was computed, ``mcnemar (exact binomial)``."""
    method = t.get("method") or "t"
    return kind if method == "t" else f"{kind} ({method})"


def noise_words(d: dict) -> list[str]:
    """Where the run noise behind "runs each to detect" comes from (``gather``'s ``noise``), one sentence per
    estimate: the sd, the models and runs it is pooled over, its df, and which of those models this report shows."""
    out = []
    several = len(d.get("noise") or []) > 1
    for e in d.get("noise") or []:
        whose = f"for {', '.join(e['candidates'])}: " if several else ""
        if e["sd"] is None:
            out.append(f"Run noise {whose}none: no model has 2 current runs of {d['metric']} in this eval "
                       "environment, so no runs to detect are computed.")
            continue
        shown = ", ".join(e["in_report"]) or "none"
        out.append(f"Run noise {whose}sd {e['sd']:.4g}, the within-model sd pooled over every model with at least 2 "
                   f"current runs of {d['metric']} in this eval environment: {len(e['models'])} models "
                   f"({', '.join(e['models'])}), {e['runs']} runs, {e['df']} df; of these, in this report: {shown}. "
                   "It sets the runs each to detect (and a sub-score's margin where none is given or graded); the "
                   "tests use only the two models' own runs or items.")
    return out


def _total_rows(d: dict) -> list[list[str]]:
    b = d["candidates"][0]["comparison"]["b_summary"]
    rows = [[f"{d['backbone']} (backbone)", str(b["n"]), _m(b["mean"]), _ci(b["ci_low"], b["ci_high"]), "", "", "",
             "", "", ""]]
    for c in d["candidates"]:
        cmp, a = c["comparison"], c["comparison"]["a_summary"]
        t = cmp.get(cmp["decided_by"]) if cmp["decided_by"] else None
        rows.append([c["name"], str(a["n"]), _m(a["mean"]), _ci(a["ci_low"], a["ci_high"]),
                     _d(t["diff"] if t else a["mean"] - b["mean"]), _ci(t["ci_low"], t["ci_high"]) if t else "-",
                     f"{test_name(cmp['decided_by'], t)} p {_p(t['p'])}" if t else "-", cmp["verdict"],
                     str(cmp["repeats_needed"] or "-"), c["advice"]])
    return rows


def _sub_rows(c: dict) -> list[list[str]]:
    subs = ((c["comparison"].get("subscores") or {}).get("subscores") or {}).values()
    rows = []
    for r in subs:
        a, b, t = r["a_summary"], r["b_summary"], r.get("test")
        note = [r["reason"]] + (["below one grade"] if r.get("below_one_grade") else [])
        rows.append([r["key"] + (" (target)" if r.get("target") else ""),
                     f"{_m(a['mean'])} (n={a['n']})" if a else "-", f"{_m(b['mean'])} (n={b['n']})" if b else "-",
                     _d(r["diff"]), "exact (no spread)" if r["zero_variance"] else _ci(t["ci_low"], t["ci_high"])
                     if t else "-", f"{r['margin']:.4g} ({r['margin_source']})" if r["margin"] is not None else "-",
                     _p(r["p_noninferior_holm"]), r["status"].replace("_", " "), "; ".join(note)])
    return rows


def _plan(c: dict, d: dict) -> list:
    p = c["plan"]
    if p is None:
        return [("p", f"Plan: none of {c['name']} vs {d['backbone']} on {d['metric']} (vecmerge evidence plan "
                      f"{c['name']} --vs {d['backbone']} --metric {d['metric']} --min-effect D --max-runs N "
                      "records one before the next runs).")]
    if p.get("error"):
        return [("p", f"Plan: cannot be judged: {p['error']}")]
    plan = p["plan"]
    lines = [f"decision: {p['decision']}: {p.get('reason', '')}",
             f"plan #{plan['id']}: min effect {plan['min_effect']:.4g}, at most {plan['max_runs']} runs per model, "
             f"alpha {plan['alpha']:.3g}; runs so far {p.get('runs')}"]
    if p.get("more_runs"):
        lines.append(f"runs that would decide: {p['more_runs']}")
    w = p.get("power") or {}
    if w.get("power_d") is not None:
        lines.append(f"power (stop_better) when made: {w['power_d']:.1%} at D, {w['power_2d']:.1%} at 2D (run sd "
                     f"{w['sd']:.4g})" + (f"; warning: {w['warning']}" if w.get("warning") else ""))
    else:
        lines.append("power: " + (w.get("warning") or "not stated (a plan recorded before vecmerge stated power)"))
    return [("p", "Plan:"), ("ul", lines)]


def _gate(c: dict) -> list:
    g = c["gate"]
    if not g:
        return [("p", f"Gate: none recorded ({c['name']} is not a vecmerge output written with --gate).")]
    rows = [[r["condition"], r["status"], str(r["detail"]), str(r["threshold"]), str(r["source"])] for r in g["rows"]]
    return [("p", f"Gate before {c['name']} was written ({g['backbone']} + alpha * ({g['x']} - {g['y']})): "
                  f"{'PASSED' if g['passed'] else 'NOT PASSED'}"),
            ("table", ["condition", "result", "detail", "threshold", "from"], rows)]


def _probes(d: dict) -> list:
    out: list = [("h", 2, "Probe and calibration")]
    if not d["probes"]:
        return out + [("p", "None recorded (vecmerge probe records function-space evidence; vecmerge evidence "
                            "calibrate says whether it may rank candidates).")]
    for p in d["probes"]:
        rows = [[s["model"], str(s["n"]), _m(s["mean"]), _ci(s["ci_low"], s["ci_high"])] for s in p["summaries"]]
        cal = p["calibration"]
        words = (f"calibration against {d['metric']}: {cal['verdict']} (Spearman {_p(cal['spearman'])} over "
                 f"{len(cal['models'])} models)" if cal else f"calibration: {p['calibration_error']}")
        out += [("h", 3, p["metric"]), ("table", ["model", "runs", "mean", "95% CI"], rows), ("p", words)]
    return out


def blocks(d: dict) -> list:
    """The report (``commands.report.gather``'s dict) as blocks, top to bottom: the recommendation, the totals
    (table and figure), then per candidate its reasons, sub-scores, plan and gate; probes and calibration."""
    rec, names = d["recommendation"], ", ".join(c["name"] for c in d["candidates"])
    way = "higher" if d["higher_is_better"] else "lower"
    conf = f"{d['confidence']:.0%}"
    out: list = [
        ("h", 1, f"Which candidate to submit: {names} against {d['backbone']}"),
        ("p", f"Metric {d['metric']} ({way} is better); ledger {d['ledger']}; {conf} intervals; every figure comes "
              "from the ledger's records through vecmerge evidence compare, plan/decide and calibrate."),
        ("h", 2, "Recommendation"), ("p", rec["headline"]), ("ul", rec["reasons"]),
        ("h", 2, f"The total against {d['backbone']}"),
        ("table", ["model", "runs", "mean", f"{conf} CI", f"minus {d['backbone']}", f"{conf} CI of the difference",
                   "test", "verdict", "runs each to detect", "advice"], _total_rows(d)),
        ("fig", "totals", f"Each model's mean with its {conf} t interval (hollow: a single run, no interval), and "
                          f"each candidate minus {d['backbone']} with the interval of the test its verdict rests on."),
        *[("p", x) for x in noise_words(d)],
    ]
    if any((c["comparison"].get("subscores") or {}).get("subscores") for c in d["candidates"]):
        out.append(("fig", "subscores", f"Each sub-score, one panel each: the models' means with their {conf} t "
                                        "intervals (dashed: the backbone)."))
    for c in d["candidates"]:
        out += [("h", 2, f"{c['name']}: {c['advice']}"), ("ul", c["reasons"])]
        if c["comparison"].get("decided_note"):
            out.append(("p", f"Test: {c['comparison']['decided_note']}."))
        rows = _sub_rows(c)
        out += ([("p", f"Sub-scores against {d['backbone']} (non-inferiority at the margin, Holm across them):"),
                 ("table", ["sub-score", c["name"], d["backbone"], "difference", f"{conf} CI", "margin (from)",
                            "p not worse (Holm)", "status", "note"], rows)] if rows else
                [("p", f"Sub-scores: none recorded for both {c['name']} and {d['backbone']}.")])
        out += _plan(c, d) + _gate(c)
    return out + _probes(d)
