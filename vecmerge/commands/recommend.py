"""``vecmerge report``'s answer to "which candidate do I submit?": a rule over verdicts already computed.

Nothing here is a statistic: every number quoted is read from ``compare_models`` (the test the verdict rests on,
the runs to detect), its sub-scores (``subscores.compare_subscores``) and the plan's decision (``decide``).
Per candidate C against the backbone B:

    worse         B is better beyond eval noise on the total                      -> do not submit
    costs         some sub-score of C is worse than B's beyond noise              -> do not submit
    better        C is better beyond eval noise (with a plan of C vs B: its decision is stop_better)
                  and every sub-score shown not worse                              -> eligible
    not shown     anything else (within noise, too few runs, a plan still running) -> not yet

Submit the eligible candidate with the largest difference (a second eligible one is compared to it, and the
reasons say whether the lead is beyond noise); none eligible: submit none yet, and name the candidate with the
largest observed difference that is not ruled out, with the runs per model that would decide.
On paired 0/1 items the registry's exact McNemar test is the one McNemar shown, and it decides (``one_mcnemar``);
the run noise behind "runs to detect" is said with the models and df it is pooled over (``noise_used``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..evidence.difference.mcnemar import McNemar
from ..evidence.difference.paired import Paired
from ..evidence.judge.compare import VERDICTS
from ..report.candidates import test_name

__all__ = ["advise", "recommend", "one_mcnemar", "noise_used", "SUBMIT", "DO_NOT_SUBMIT", "NOT_YET"]

SUBMIT, DO_NOT_SUBMIT, NOT_YET = "eligible", "do not submit", "not shown better yet"


def _n(x, digits: int = 5) -> str:
    return "-" if x is None else f"{x:+.{digits}g}"


def _test_words(cmp: dict) -> str:
    """``+0.01551, 95% CI [-0.00053, 0.03155], Welch p 0.0558``: the test the verdict rests on."""
    kind = cmp["decided_by"]
    t = cmp.get(kind) if kind else None
    if t is None:
        return "no test"
    conf = f"{cmp['confidence']:.0%}"
    return (f"{t['diff']:+.5g}, {conf} CI [{t['ci_low']:.5g}, {t['ci_high']:.5g}], {test_name(kind, t)} p "
            f"{t['p']:.3g}")


def _code(t: dict, higher_is_better: bool | None) -> str:
    """``compare_records``' verdict rule (its step 3) on one test: beyond noise, and the side the direction favours."""
    if not t["beyond_noise"]:
        return "within_noise"
    a_up = t["diff"] > 0
    if higher_is_better is None:
        return "a_higher" if a_up else "b_higher"
    return "a_better" if a_up == higher_is_better else "b_better"


def one_mcnemar(cmp: dict) -> dict:
    """``cmp`` with one McNemar test: on paired 0/1 items the registry's exact one (``mcnemar``).

    ``compare_models`` reports two there: the paired test carries McNemar's p (a chi-square from 25 discordant
    items on) beside the paired t's interval, and the registry's ``mcnemar`` is the exact binomial test with its
    exact interval (which excludes 0 exactly when p < alpha). The paired row is dropped (``paired`` None); where it
    decided, ``mcnemar`` decides instead, by the same rule, and ``decided_note`` says which test decided (and what the
    dropped row said, when its verdict differed). Anything else is returned as it is.

    Args:
        cmp (dict): ``compare_models(a, b)``.
    """
    paired, exact = cmp.get(Paired.name), cmp.get(McNemar.name)
    if not paired or not exact or not str(paired.get("method") or "").startswith("McNemar"):
        return cmp
    b, c = exact["discordant"] or (None, None)
    out = {**cmp, Paired.name: None}
    note = (f"McNemar's exact test over {exact['n'][0]} paired 0/1 items ({b} only {cmp['a']} right, {c} only "
            f"{cmp['b']}): p {exact['p']:.3g}")
    if cmp["decided_by"] == Paired.name:
        code = _code(exact, cmp["higher_is_better"])
        out.update(decided_by=McNemar.name, verdict_code=code,
                   verdict=VERDICTS[code].format(a=cmp["a"], b=cmp["b"], metric=cmp["metric"]))
        out["decided_note"] = f"decided by {note}" + (
            "" if code == cmp["verdict_code"] else f"; evidence compare's paired row ({paired['method']}, p "
            f"{paired['p']:.3g}) says {cmp['verdict']}")
    else:
        out["decided_note"] = f"decided by the {cmp['decided_by'] or 'no'} test; shown beside it: {note}"
    return out


def noise_used(rows: Sequence[dict]) -> list[dict]:
    """Which runs the run noise behind "runs each to detect" is pooled over, once per distinct estimate.

    ``compare_models`` pools s_p² = Σ (n_m - 1) s_m² / Σ (n_m - 1) over every model with ≥ 2 current runs of the
    metric in the comparison's eval environment (the whole ledger, not only the report's models).

    Returns:
        list[dict]: ``{"sd", "df", "runs", "models", "in_report", "candidates"}`` per estimate (``sd`` None: no model
        has two runs), in the order the candidates first use it.
    """
    names = {r["name"] for r in rows} | {r["comparison"]["b"] for r in rows}
    out: list[dict] = []
    for r in rows:
        p = r["comparison"].get("pooled")
        entry = ({"sd": None, "df": 0, "runs": 0, "models": [], "in_report": []} if p is None else
                 {"sd": p["sd"], "df": p["df"], "runs": p["df"] + len(p["models"]), "models": list(p["models"]),
                  "in_report": [m for m in p["models"] if m in names]})
        same = next((e for e in out if all(e[k] == entry[k] for k in ("sd", "df", "models"))), None)
        if same is None:
            out.append({**entry, "candidates": [r["name"]]})
        else:
            same["candidates"].append(r["name"])
    return out


def _mean_words(cmp: dict) -> str:
    a, b = cmp["a_summary"], cmp["b_summary"]
    return f"{cmp['a']} {a['mean']:.6g} over {a['n']} run(s), {cmp['b']} {b['mean']:.6g} over {b['n']} run(s)"


def _within_runs(cmp: dict) -> str:
    """Where a single run of A lies among B's runs (``; its one run lies within v51's runs, 0.9895 to 1.018``)."""
    a, b = cmp["a_summary"], cmp["b_summary"]
    if a["n"] != 1 or b["n"] < 2:
        return ""
    where = ("within" if b["min"] <= a["mean"] <= b["max"] else "below all of" if a["mean"] < b["min"]
             else "above all of")
    return f"; its one run lies {where} {cmp['b']}'s runs ({b['min']:.6g} to {b['max']:.6g})"


def _sub_words(row: dict, name: str, backbone: str) -> str:
    test = row.get("test")
    how = ("exact: neither model's runs vary" if row["zero_variance"] else
           f"CI [{test['ci_low']:.5g}, {test['ci_high']:.5g}], Holm p {row['p_holm']:.3g}" if test else "no test")
    return f"{row['key']}: {name} - {backbone} = {_n(row['diff'])} ({how})"


def advise(cmp: dict, plan: dict | None) -> tuple[str, list[str]]:
    """One candidate's advice and its reasons (module docstring), each reason with its numbers.

    Args:
        cmp (dict): ``compare_models(candidate, backbone)``. plan (dict | None): the plan's state (``decide``).
    """
    c, b = cmp["a"], cmp["b"]
    code = cmp["verdict_code"]
    reasons: list[str] = []
    subs = (cmp.get("subscores") or {}).get("subscores") or {}
    worse = [r for r in subs.values() if r["status"] == "worse"]
    unknown = [r for r in subs.values() if r["status"] == "unknown"]
    if code == "b_better":
        reasons.append(f"{b} is better beyond eval noise: {c} - {b} = {_test_words(cmp)}")
    elif code == "a_better" and worse:  # the trade first: better on the total, at a sub-score's cost
        reasons.append(f"{c} is better than {b} on the total beyond eval noise ({_test_words(cmp)}), but it costs "
                       f"{len(worse)} sub-score(s): submit it only if that trade is acceptable")
    for r in worse:
        reasons.append(f"it costs a sub-score, worse beyond noise: {_sub_words(r, c, b)}")
    if code == "b_better" or worse:
        return DO_NOT_SUBMIT, reasons
    planned = plan is not None and plan.get("decision") != "stop_better"
    if code == "a_better" and not planned:
        reasons.append(f"{c} is better than {b} beyond eval noise: {_test_words(cmp)}")
        if plan is not None:
            reasons.append(f"its plan (#{plan['plan']['id']}) says stop_better: {plan['reason']}")
        advice = SUBMIT
    else:
        advice = NOT_YET
        if code == "a_better" and plan is not None:  # a plan that has not said stop_better holds it back
            reasons.append(f"the fixed-n test says better ({_test_words(cmp)}), but the plan of {c} vs {b} says "
                           f"{plan['decision']}: {plan['reason']}")
        elif code == "within_noise":
            reasons.append(f"within noise: {c} - {b} = {_test_words(cmp)}")
        else:
            reasons.append(f"not enough runs: {_mean_words(cmp)}; one run has no spread, so no interval and no test"
                           + _within_runs(cmp))
        if cmp.get("repeats_needed"):
            reasons.append(f"about {cmp['repeats_needed']} runs each of {c} and {b} would detect a difference of "
                           f"{cmp['detect']:.4g} (power 0.8, alpha 0.05, run noise sd {cmp['noise_sd']:.4g})")
    if advice == SUBMIT and unknown:  # UNKNOWN is not a pass, as in the gate
        advice = NOT_YET
        reasons.append(f"better on the total, but {len(unknown)} sub-score(s) not yet shown not worse (unknown is "
                       "not a pass): record their runs, or a margin, first")
    for r in unknown:
        if r["a_summary"] is None:
            reasons.append(f"{c} recorded no {r['key']}: what it costs that sub-score is unknown")
            continue
        more = f"; about {r['more_runs']} runs each would decide" if r.get("more_runs") else ""
        reasons.append(f"not yet shown not worse: {_sub_words(r, c, b)}{more}")
    return advice, reasons


def _diff(cmp: dict) -> float:
    t = cmp.get(cmp["decided_by"]) if cmp["decided_by"] else None
    if t is not None:
        return t["diff"]
    return cmp["a_summary"]["mean"] - cmp["b_summary"]["mean"]


def _held_back(row: dict) -> str:
    """Why a candidate better on the total is not submitted, in a few words (a sub-score's cost or unknown, a plan)."""
    subs = ((row["comparison"].get("subscores") or {}).get("subscores") or {}).values()
    if row["advice"] == DO_NOT_SUBMIT:
        return "it costs a sub-score beyond noise (submit it only if that trade is acceptable)"
    unknown = sum(1 for r in subs if r["status"] == "unknown")
    if unknown:
        return f"{unknown} sub-score(s) not yet shown not worse (record their runs, or a margin, first)"
    return "its plan has not said stop_better yet"


def recommend(rows: Sequence[dict], backbone: str, higher_is_better: bool,
              compare: Callable[[str, str], dict] | None = None) -> dict:
    """The report's answer over every candidate's advice.

    Args:
        rows (Sequence[dict]): ``{"name", "comparison", "advice", "reasons"}`` per candidate.
        backbone (str): B. higher_is_better (bool): the metric's direction.
        compare (Callable[[str, str], dict] | None): ``compare_models(a, b)``, called once for the two leading
            eligible candidates when there are two or more.

    Returns:
        dict: ``{"submit": name | None, "headline": str, "reasons": [str], "lead": comparison | None}``.
    """
    sign = 1.0 if higher_is_better else -1.0
    ranked = sorted(rows, key=lambda r: -sign * _diff(r["comparison"]))
    eligible = [r for r in ranked if r["advice"] == SUBMIT]
    if eligible:
        best = eligible[0]
        reasons = [f"{best['name']}: {x}" for x in best["reasons"]]
        lead = compare(best["name"], eligible[1]["name"]) if compare is not None and len(eligible) > 1 else None
        if lead is not None:
            reasons.append(f"over {lead['b']}, the next eligible candidate: {lead['verdict']} "
                           f"({lead['a']} - {lead['b']} = {_test_words(lead)})")
        reasons += [f"{r['name']} ({r['advice']}{', a larger difference' if i < ranked.index(best) else ''}): "
                    f"{r['reasons'][0]}" for i, r in enumerate(ranked)
                    if r is not best and r["reasons"] and (lead is None or r["name"] != lead["b"])]
        return {"submit": best["name"], "headline": f"submit {best['name']}: better than {backbone} beyond eval "
                "noise, and no sub-score worse", "reasons": reasons, "lead": lead}
    open_ = [r for r in ranked if r["advice"] == NOT_YET]
    reasons = [f"{r['name']}: {r['reasons'][0]}" for r in ranked if r["advice"] == DO_NOT_SUBMIT]
    better = [r for r in ranked if r["comparison"]["verdict_code"] == "a_better"]
    if better:  # shown better on the total, held back: say so first, never "no candidate is shown better"
        held = better[0]
        headline = (f"submit none yet: {held['name']} is better than {backbone} on the total beyond eval noise, but "
                    + _held_back(held))
    else:
        headline = None
    if not open_:
        return {"submit": None, "headline": headline or f"submit none: every candidate is worse than {backbone} or "
                "costs a sub-score", "reasons": reasons, "lead": None}
    best = open_[0]
    reasons = [f"{best['name']} has the largest observed difference not ruled out: {x}" if i == 0 else
               f"{best['name']}: {x}" for i, x in enumerate(best["reasons"])] + reasons
    reasons += [f"{r['name']}: {r['reasons'][0]}" for r in open_[1:]]
    runs = best["comparison"].get("repeats_needed")
    again = (f"the closest, {best['name']}, would need about {runs} runs each to decide" if runs
             else f"{best['name']} is the one to run again")
    return {"submit": None, "headline": headline or f"submit none yet: no candidate is shown better than {backbone} "
            f"beyond eval noise; {again}", "reasons": reasons, "lead": None}
