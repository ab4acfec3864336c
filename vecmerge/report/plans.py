"""``evidence plan`` and ``evidence decide`` as text: the plan, its stated power, its looks and the decision."""

from __future__ import annotations

from ..evidence.difference.group_sequential import GROUP_SEQUENTIAL
from .evidence import _ci, _short
from .format import g, table


def _power_lines(w: dict | None, p: dict) -> list[str]:
    """A plan's stated power: at D and 2D, expected runs, the fixed-n runs, the warning."""
    if not w:
        return []
    out = []
    if w.get("power_d") is not None:
        line = (f"power (stop_better) {w['power_d']:.1%} at D = {p['min_effect']:g}, {w['power_2d']:.1%} at 2D "
                f"(run sd {w['sd']:.4g}; {w['sims']} seeded simulations)")
        if w.get("expected_runs_d") is not None:
            line += f"; expected runs in all {w['expected_runs_d']:.1f} at D, {w['expected_runs_0']:.1f} at 0"
        if w.get("fixed_n") is not None and w["power_d"] > p["alpha"] / 2:  # below alpha no test "matches" it
            line += f"; a fixed-n t test needs {w['fixed_n']} runs of each for the same power"
        out.append(line)
    if w.get("warning"):
        out.append(f"warning: {w['warning']}")
    elif w.get("n_for_80"):
        out.append(f"about {w['n_for_80']} runs of each would reach 80% power at D")
    return out


def render_plan(d: dict) -> str:
    """``evidence plan``: what was pre-registered, what it can do (power), and how to ask for the decision."""
    p = d["plan"]
    design = p.get("design") or {}
    if p["test"] == GROUP_SEQUENTIAL.name:
        how = (f"planned looks (group-sequential Welch, {design.get('spending', 'obf')} alpha spending, a look every "
               f"{design.get('look_every', 1)} run(s), futility beta {design.get('beta', 0.1):g})")
    else:
        how = (f"anytime-valid t-mixture, prior scale {p['prior_scale']:.4g}" +
               (f" = D / noise sd {p['noise_sd']:.4g}" if p["noise_sd"] else " (no run noise recorded)"))
    existing = design.get("existing")
    looks = (f"its looks: the {existing[0]} + {existing[1]} runs recorded before it (the first look), then runs "
             f"recorded from now on" if existing else f"its looks: runs recorded from now on (record id >= "
             f"{d['looks_from']})")
    return "\n".join([
        f"plan {p['id']} recorded: is {p['a']} better than {p['b']} on {p['metric']} "
        f"({'higher' if p['higher_is_better'] else 'lower'} is better) by at least D = {p['min_effect']:g}?",
        f"at most {p['max_runs']} runs of each, alpha {p['alpha']:g} (better or worse); {how}",
        *_power_lines(d.get("power"), p),
        f"weights: {p['a']} {_short(p['a_sha256'])}, {p['b']} {_short(p['b_sha256'])}; immutable "
        f"(a new plan is a new record)",
        f"{looks}; ask with: vecmerge evidence decide {p['a']} --vs {p['b']}"])


def _look_rows(looks: list[dict], p: dict) -> str:
    """The looks as a table: the mixture's confidence sequence, or the planned test's t and boundaries."""
    if "e_value" in looks[0]:
        rows = [[x["look"], x["model"], x["n_a"], x["n_b"], f"{x['diff']:+.5g}", g(x["sd"]),
                 _ci(x["ci_low"], x["ci_high"]) if x["ci_low"] is not None else "(-inf, inf)", g(x["e_value"]),
                 x["decision"] + (f" (~{x['more_runs']} more each)" if x["more_runs"] else "")] for x in looks]
        return table(rows, ["look", "run of", f"{p['a']} n", f"{p['b']} n", "diff", "sd",
                            f"{1 - p['alpha']:.0%} confidence sequence", "e-value", "decision"])
    rows = [[x["look"], x["model"], x["n_a"], x["n_b"], f"{x['diff']:+.5g}", g(x["se"]), f"{x['df']:.3g}",
             f"{x['t']:.3g}", "-" if x["better_at"] is None else f"±{x['better_at']:.3g}",
             "-" if x["futile_below"] is None else f"{x['futile_below']:+.4g}", f"{x['fraction']:.2f}",
             x["decision"]] for x in looks]
    return table(rows, ["look", "run of", f"{p['a']} n", f"{p['b']} n", "diff", "SE", "df", "t", "stop at t",
                        "futile if diff <=", "information", "decision"])


def render_decide(d: dict) -> str:
    """``evidence decide``: the plan, each look (``--replay``), and the decision with its reason."""
    p = d["plan"]
    out = [f"plan {p['id']}: {p['a']} vs {p['b']} on {p['metric']}; D {p['min_effect']:g}, at most {p['max_runs']} "
           f"runs each, alpha {p['alpha']:g} ({p['test']}); runs used {d['runs'][0]} + {d['runs'][1]}"]
    out += _power_lines(d.get("power"), p)
    looks = d.get("looks")
    if looks is None and d["last"] is not None:
        looks = [d["last"]]
    if looks:
        out.append(_look_rows(looks, p))
    if d["after_stop"]:
        out.append(f"note: {d['after_stop']} run(s) recorded after the stop were not looked at")
    if d["beyond_max"]:
        out.append(f"note: {d['beyond_max']} run(s) past the plan's {p['max_runs']} per model were not looks")
    out.append(f"decision: {d['decision']} ({d['reason']})")
    return "\n".join(out)
