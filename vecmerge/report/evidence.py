"""Text for the evidence commands (``vecmerge evidence ...``, ``ls``, ``gate``) and the ``show --plot`` figure.

Every renderer takes the JSON-ready dict the command returns (``--json`` prints that dict itself), so
the table and the JSON never disagree. Numbers: 4 significant digits for spreads, 6 for means,
minima and maxima, 5 for intervals and differences (a difference of runs is the point).
"""

from __future__ import annotations

import textwrap

from ..evidence import difference
from .format import g, table
from .plots import show_figure


def _f(x, digits: int = 6) -> str:
    return "-" if x is None else f"{x:.{digits}g}"


def _ci(lo, hi, digits: int = 5) -> str:
    return "-" if lo is None else f"[{lo:.{digits}g}, {hi:.{digits}g}]"


def _ci_of(pair, digits: int = 5) -> str:
    """``_ci`` of a ``(low, high)`` pair, or "-" for None."""
    return "-" if pair is None else _ci(pair[0], pair[1], digits)


def _short(sha) -> str:
    return "-" if not sha else sha[:12]


def _env_line(env: dict | None, what: str = "eval environment") -> list[str]:
    """``eval environment ID: key=value, ...`` for an environment with fields (none for the empty one)."""
    if not env or not env.get("fields"):
        return []
    return [f"{what} {env['id']}: " + ", ".join(f"{k}={v}" for k, v in env["fields"].items())]


def render_add(d: dict) -> str:
    """``evidence add``: what was recorded, under which content hash, and in which eval environment."""
    runs = len(d["values"])
    tied = (f"sha256 {_short(d['sha256'])} (its adapter's weights and config now)" if d["sha256"] else
            f"no sha256: {d['model']} is an external model (not an adapter of this workspace), so these records "
            "never go stale")
    direction = {True: "higher is better", False: "lower is better", None: "direction not recorded"}[d["direction"]]
    return "\n".join([f"recorded {runs} run{'s' * (runs != 1)} of {d['model']} on {d['metric']} ({direction}); "
                      f"{tied}; ids {d['ids'][0]}..{d['ids'][-1]}", *_env_line(d.get("env"))])


def render_import(d: dict) -> str:
    """``evidence import``: how many records of which models and metrics, from which files."""
    items = f" ({d['item_level']} item-level)" if d["item_level"] else ""
    lines = [f"imported {d['records']} record{'s' * (d['records'] != 1)}{items} from {', '.join(d['files'])}",
             f"models: {', '.join(d['models']) or '-'}; metrics: {', '.join(d['metrics']) or '-'}"]
    if d.get("unhashed"):
        lines.append(f"without a sha256 (not adapters here, never stale): {', '.join(d['unhashed'])}")
    if d["directions"]:
        lines.append("directions: " + ", ".join(f"{m} {'higher' if h else 'lower'} is better"
                                                for m, h in d["directions"].items()))
    for env_id, fields in (d.get("environments") or {}).items():
        lines += _env_line({"id": env_id, "fields": fields})
    for dup in d.get("duplicates") or []:
        lines.append(f"not counted twice: {dup['file']} has the content of {dup['same_as']}")
    return "\n".join(lines)


def _summary_table(summaries: list[dict], env_column: bool) -> str:
    rows = []
    harness = any(s.get("harness_se") is not None for s in summaries)
    for s in summaries:
        rows.append([s["model"], s["metric"] if s["sub"] is None else f"  sub.{s['sub']}",
                     *([s.get("env") or "-"] if env_column else []), s["n"], _f(s["mean"]), g(s["std"]), g(s["se"]),
                     *([g(s.get("harness_se"))] if harness else []),
                     _ci(s["ci_low"], s["ci_high"]), _f(s["min"]), _f(s["max"]), g(s["range"]),
                     "single run: no spread, no interval" if s["single_run"] else ""])
    conf = f"{summaries[0]['confidence']:.0%} CI (t)" if summaries else "CI"
    head = ["model", "metric", *(["env"] if env_column else []), "n", "mean", "std", "SE",
            *(["harness SE (items)"] if harness else []), conf, "min", "max", "range", "note"]
    return table(rows, head) if rows else "no whole-run records"


def render_replicates(groups: list[dict]) -> list[str]:
    """Each replicate group's variance components: between trainings, within evaluations, with their intervals."""
    out = []
    for c in groups:
        conf = f"{c['confidence']:.0%}"
        raw = "" if c["var_between_training_raw"] >= 0 else (
            f"; the estimate {c['var_between_training_raw']:.3g} is below 0, shown as 0")
        out.append(f"replicates of {c['group']} on {c['metric']}: {c['trainings']} trainings "
                   f"({', '.join(c['members'])}), {c['evaluations']} runs; between trainings var "
                   f"{c['var_between_training']:.4g} (sd {c['sd_training']:.4g}, {conf} CI "
                   f"{_ci_of(c['ci_between_training'], 4)}), within evaluations var {c['var_within_eval']:.4g} "
                   f"(sd {c['sd_eval']:.4g}, {conf} CI {_ci_of(c['ci_within_eval'], 4)}); one run of a fresh "
                   f"training: sd {c['sd_total']:.4g}{raw}")
    return out


def render_show(d: dict) -> str:
    """``evidence show``: n, mean, std, SE, CI, min, max, range per model, sub-score and eval environment (an env
    column when there are several; ``--by env``: one table per environment); stale and item counts; replicates."""
    envs = d.get("environments") or []
    if d.get("by") == "env":
        out = []
        for e in envs:
            fields = ", ".join(f"{k}={v}" for k, v in e["fields"].items()) or "no fields recorded"
            out += [f"environment {e['id']}: {fields}",
                    _summary_table([s for s in d["summaries"] if s.get("env") == e["id"]], False), ""]
        out = out[:-1] if out else ["no whole-run records"]
    else:
        out = [_summary_table(d["summaries"], len(envs) > 1)]
        if len(envs) > 1:
            out += [f"env {e['id']}: " + (", ".join(f"{k}={v}" for k, v in e["fields"].items()) or "no fields recorded")
                    + " (never pooled with the others)" for e in envs]
        elif envs:
            out += _env_line(envs[0])
    for st in d["stale"]:
        what = "included (--stale)" if d["include_stale"] else "left out (--stale shows them)"
        out.append(f"stale: {st['records']} record(s) of {st['model']} on {st['metric']} measured other weights "
                   f"({', '.join(_short(s) for s in st['sha256s'])}); {what}")
    for it in d["item_level"]:
        out.append(f"item-level: {it['model']} on {it['metric']}: {it['items']} items in {it['records']} records "
                   "(compare pairs them)")
    for gr in d.get("grids", []):
        out.append(f"grid: {gr['metric']}" + (f" sub.{gr['sub']}" if gr["sub"] else "")
                   + (f" (env {gr['env']})" if len(envs) > 1 else "") + f" moves in grades of "
                   f"{gr['step']:.5g} ({len(gr['levels'])} values seen at grades "
                   f"{', '.join(map(str, gr['grades']))}" + ("; multiples of the step" if gr["multiples"] else "")
                   + "): a difference below one grade is no grade moved")
    out += render_replicates(d.get("replicates") or [])
    if d["directions"]:
        out.append("directions: " + ", ".join(f"{m} {'higher' if h else 'lower'} is better"
                                              for m, h in d["directions"].items()))
    return "\n".join(out)


def _runs(s) -> str:
    """``n: mean [CI]`` of one model's sub-score runs."""
    if s is None:
        return "-"
    return f"{s['n']}: {s['mean']:.4g}" + ("" if s["ci_low"] is None else f" {_ci(s['ci_low'], s['ci_high'], 4)}")


def _p(p, holm) -> str:
    return "-" if p is None else f"{p:.2g}" + ("" if holm is None else f" / {holm:.2g}")


def render_subscores(s: dict) -> list[str]:
    """``compare``'s sub-score table, the grades, the undecided ones' reasons and the cost summary
    (``SubScoreComparison.to_dict()``)."""
    a, b, conf = s["a"], s["b"], f"{s['confidence']:.0%}"
    rows, notes = [], []
    for key, r in s["subscores"].items():
        t = r["test"]
        diff = "-" if r["diff"] is None else f"{r['diff']:+.4g}" + (
            "" if t is None else f" {_ci(t['ci_low'], t['ci_high'], 3)}")
        status = "target" if r["target"] else {"worse": "WORSE", "not_worse": "not worse"}.get(r["status"], "unknown")
        rows.append([key, _runs(r["a_summary"]), _runs(r["b_summary"]), diff, r["kind"] or "-", _p(r["p"], r["p_holm"]),
                     g(r["margin"]), (r["margin_source"] or "-").split(",")[0],
                     _p(r["p_noninferior"], r["p_noninferior_holm"]), status])
        if r["margin_source"] and r["margin_source"].startswith("one grade"):
            notes.append(f"margin of {key}: {r['margin_source']}")
        if r["grid"] is not None:
            moved = "" if r["diff"] is None else f"; the difference is {r['diff'] / r['grid']['step']:+.2f} grades" + (
                ", below one grade" if r["below_one_grade"] else "")
            notes.append(f"grid: {key} moves in grades of {r['grid']['step']:.5g}{moved}")
        if r["status"] != "not_worse" or r["zero_variance"]:
            notes.append(f"{key}: {r['reason']}" + (f"; about {r['more_runs']} more run(s) each would decide"
                                                    if r["more_runs"] else ""))
    sources = sorted({r["margin_source"] for r in s["subscores"].values() if r["margin_source"]})
    out = [f"sub-scores of {s['metric']} ({a} - {b}; Holm across the {len(s['family'])} tested; margin: "
           f"{', '.join(sources) or 'none'})",
           table(rows, ["sub-score", f"{a} n: mean {conf} CI", f"{b} n: mean {conf} CI", f"diff {conf} CI", "test",
                        "p / Holm", "margin", "margin from", "not worse p / Holm", "status"])]
    out += notes
    cost = s["cost"]
    target = f" of raising {s['target']}" if s["target"] else ""
    out.append(f"what it costs the others{target}: worse beyond noise: {', '.join(cost['worse']) or 'none'}; "
               f"shown not worse: {', '.join(cost['not_worse']) or 'none'}; "
               f"unknown: {', '.join(cost['unknown']) or 'none'}")
    return out


def render_compare(d: dict) -> str:
    """``evidence compare``: both summaries, each test, the ledger's noise, repeats needed and the verdict."""
    direction = {True: "higher is better", False: "lower is better", None: "no direction recorded"}[
        d["higher_is_better"]]
    out = [f"compare {d['a']} vs {d['b']} on {d['metric']} ({direction})", *_env_line(d.get("env"))]
    rows = []
    shown = [s for s in (d["a_summary"], d["b_summary"]) if s is not None]
    harness = any(s.get("harness_se") is not None for s in shown)
    for s in shown:
        rows.append([s["model"], s["n"], _f(s["mean"]), g(s["std"]), g(s["se"]),
                     *([g(s.get("harness_se"))] if harness else []), _ci(s["ci_low"], s["ci_high"])])
    if rows:
        out.append(table(rows, ["model", "runs", "mean", "std", "SE", *(["harness SE (items)"] if harness else []),
                                f"{d['confidence']:.0%} CI"]))
    rows = []
    for test in difference.report_order():
        t = d.get(test.name)
        if t is not None:
            n = test.size(t)
            if t.get("discordant") is not None:
                n += f"; {t['discordant'][0]} only {d['a']} right, {t['discordant'][1]} only {d['b']}"
            name = test.name if t.get("method", "t") == "t" else f"{test.name} ({t['method']})"
            rows.append([name, f"{t['diff']:+.5g}", g(t["se"]), f"{t['df']:.3g}", _ci(t["ci_low"], t["ci_high"]),
                         f"{t['p']:.3g}", n, "yes" if t["beyond_noise"] else "no"])
    if rows:
        out.append(table(rows, [f"test ({d['a']} - {d['b']})", "diff", "SE", "df", f"{d['confidence']:.0%} CI",
                                 "p", "n", "beyond noise"]))
    if d["pooled"] is not None:
        p = d["pooled"]
        out.append(f"pooled within-model noise: sd {p['sd']:.4g} over {', '.join(p['models'])} ({p['df']} df)")
    if d["repeats_needed"] is not None:
        out.append(f"runs per model to detect a difference of {d['detect']:.4g} (power 0.8, alpha 0.05, "
                   f"noise sd {d['noise_sd']:.4g}): {d['repeats_needed']}")
    elif d["detect"]:
        out.append(f"runs per model to detect {d['detect']:.4g}: not computable (no noise estimate)")
    out.append(f"verdict: {d['verdict']}" + (f" (by the {d['decided_by']} test)" if d["decided_by"] else ""))
    out += [f"note: {r}" for r in d["reasons"]]
    out += _render_training_test(d)
    if d.get("grid"):
        step, sa, sb = d["grid"]["step"], d["a_summary"], d["b_summary"]
        moved = "" if not (sa and sb) else f"; the difference of means, {sa['mean'] - sb['mean']:+.4g}, is " \
            f"{(sa['mean'] - sb['mean']) / step:+.2f} grades" + (
                " (below one grade)" if abs(sa["mean"] - sb["mean"]) < step - 2 * d["grid"]["tolerance"] else "")
        out.append(f"grid: {d['metric']} moves in grades of {step:.5g}{moved}")
    if d.get("subscores"):
        out += [""] + render_subscores(d["subscores"])
    return "\n".join(out)


def _render_training_test(d: dict) -> list[str]:
    """``compare``'s replicate lines: each group's components, then the test over trainings."""
    reps = d.get("replicates")
    if not reps:
        return []
    out = render_replicates(reps["groups"])
    t, noise = reps["test"], reps["noise"]
    if t is None:
        return out + [f"over trainings: no test ({reps['reason']})"]
    return out + [f"over trainings ({t['n'][0]} of {d['a']}: {', '.join(reps['trainings'][0])}; {t['n'][1]} of "
                  f"{d['b']}: {', '.join(reps['trainings'][1])}; training plus evaluation noise, sd of a training's "
                  f"mean {noise['sd']:.4g}, {noise['df']} df): diff {t['diff']:+.5g}, {d['confidence']:.0%} CI "
                  f"{_ci(t['ci_low'], t['ci_high'])}, p {t['p']:.3g}, beyond noise "
                  f"{'yes' if t['beyond_noise'] else 'no'}"]


def render_calibrate(d: dict) -> str:
    """``evidence calibrate``: rank correlations with bootstrap intervals, pairwise accuracy, the noise ceiling."""
    conf = f"{d['confidence']:.0%}"
    rows = [["models with both", len(d["models"]), ", ".join(d["models"]) or "-"],
            ["Spearman rho", g(d["spearman"]), f"{conf} bootstrap CI {_ci_of(d['spearman_ci'], 3)}"
             f", p {g(d['spearman_p'], 3)}"],
            ["Kendall tau-b", g(d["kendall"]), f"{conf} bootstrap CI {_ci_of(d['kendall_ci'], 3)}"
             f", p {g(d['kendall_p'], 3)}"],
            ["pairwise accuracy", g(d["pairwise_accuracy"]), f"over {d['pairs']} pairs of models"],
            ["target noise ceiling", g(d["noise_ceiling"]),
             f"rho of one {d['target']} run vs the mean of the others ({d['noise_ceiling_models']} models)"]]
    out = [f"calibrate proxy {d['proxy']} against target {d['target']}" +
           (" (proxy negated: the directions differ)" if d["flipped"] else ""),
           table(rows, ["", "", ""], "plain"),
           f"verdict: {d['verdict']} (needs {d['min_models']} models, and Spearman's lower bound >= "
           f"{d['min_spearman_low']:g} to rank candidates)"]
    out += [f"note: {r}" for r in d["reasons"]]
    for metric, env in (d.get("environments") or {}).items():
        out += _env_line(env, f"{metric} measured under environment")
    return "\n".join(out)


def render_ls(rows: list[dict], metric: str | None) -> str:
    """``vecmerge ls``: name, path, sha256, base model, parent, runs and mean of the default metric."""
    body = [[r["name"], r["path"], r["sha256_short"] or f"({r.get('problem') or 'unreadable'})",
             r["base_model"] or "-", r["parent"] or ("(root)" if r.get("root") else "-"),
             "-" if r["runs"] is None else r["runs"],
             f"- ({r['environments']} environments)" if (r.get("environments") or 0) > 1 else _f(r["mean"]),
             r["stale"] or ""] for r in rows]
    out = table(body, ["name", "path", "sha256", "base model", "parent", f"runs ({metric or 'no metric'})", "mean",
                       "stale"])
    return out if rows else "no adapters listed (add them under adapters: in vecmerge.yaml)"


def _wrap(text: str, width: int) -> str:
    return "\n".join(textwrap.wrap(str(text), width, break_on_hyphens=False)) or "-"


def gate_verdict(d: dict) -> str:
    """``PASSED: all 7 conditions`` or ``NOT PASSED: ...`` naming each condition that is not a PASS."""
    bad = [r for r in d["rows"] if r["status"] != "PASS"]
    unknown = " (UNKNOWN is not a pass)" if any(r["status"] == "UNKNOWN" for r in bad) else ""
    return (f"PASSED: all {len(d['rows'])} conditions" if not bad else
            f"NOT PASSED: {', '.join(r['condition'] + ' ' + r['status'] for r in bad)}{unknown}")


def _detail(row: dict, d: dict) -> str:
    """A row's detail; the common parent's adds the closeness of X to Y (supporting figures, not judged)."""
    close = (row.get("numbers") or {}).get("closeness") or {}
    if row["condition"] != "common parent" or close.get("cosine") is None:
        return row["detail"]
    x, y = d["x"], d["y"]
    return (f"{row['detail']}; cos({x}, {y}) = {close['cosine']:.4f}, ||{x} - {y}|| / ||{y}|| = "
            f"{close['relative_distance']:.4g}")


def render_gate(d: dict) -> str:
    """``vecmerge gate``: one row per condition with PASS / FAIL / UNKNOWN, the numbers, the threshold, its source.

    Args:
        d (dict): ``pipeline.gate.GateCheck.to_dict()``.
    """
    rows = [[r["condition"], r["status"], _wrap(_detail(r, d), 52), _wrap(r["threshold"], 36),
             _wrap(r["source"], 22)] for r in d["rows"]]
    head = (f"gate: {d['backbone']} + alpha * ({d['x']} - {d['y']}); metric {d['metric'] or '-'}; "
            f"ledger {d['ledger']}")
    return "\n".join([head, *_env_line(d.get("env")), "",
                      table(rows, ["condition", "result", "detail", "threshold", "from"], "simple"), "",
                      gate_verdict(d)])


def plot_show(d: dict, f) -> None:
    """``evidence show --plot``: ``plots.show_figure`` (each metric zoomed to its data with error bars, its
    sub-scores as small multiples).

    Args:
        d (dict): ``commands.summaries.show``'s result. f (BinaryIO): where the PNG goes
            (``outputs.transaction.write_file`` stages it and moves it into place).
    """
    show_figure(d, f)
