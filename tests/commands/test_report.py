"""``vecmerge report`` on the user's published numbers (``examples/evidence/scores.csv`` imported into a ledger in
tmp_path, as the README does), rendered; its recommendation and every figure it quotes checked against an
independent computation here (numpy means, scipy's Welch test and t quantiles, runs to detect by scanning scipy's
noncentral t): the printed strings equal the independent values formatted to the report's digits, and the
gathered numbers agree to rel 1e-10. Bad input: one ``error:`` line, exit 2, nothing written.
"""

from __future__ import annotations

import base64
import math
import re
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

pytest.importorskip("matplotlib")

SCORES = Path(__file__).parents[2] / "examples" / "evidence" / "scores.csv"
V51 = [1.0180, 0.9895, 1.0004, 1.0105, 1.0142]
V28 = [0.9836, 0.9890]
V58 = [1.0282, 1.0234, 1.0145]
REL = 1e-10


@pytest.fixture
def ledger(tmp_path, monkeypatch, run_cli):
    monkeypatch.chdir(tmp_path)
    res = run_cli("evidence", "import", SCORES, "--higher-is-better", "official_total")
    assert res.exit_code == 0, res.output
    return tmp_path


def ok(res):
    assert res.exit_code == 0, res.output
    return res


def one_error_line(res) -> str:
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    return lines[0]


def welch(a, b, conf=0.95):
    """A - B: diff, CI and two-sided p by hand (Welch-Satterthwaite df, scipy's t distribution)."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
    se = math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    half = stats.t.ppf(0.5 + conf / 2, df) * se
    diff = a.mean() - b.mean()
    return diff, diff - half, diff + half, 2 * stats.t.sf(abs(diff) / se, df)


def runs_to_detect(delta, sd, alpha=0.05, power=0.8):
    """The fewest n with two-sided two-sample t power >= 0.8, by a plain scan (the code bisects)."""
    for n in range(2, 10_000):
        df, ncp = 2 * n - 2, abs(delta) / (sd * math.sqrt(2 / n))
        crit = stats.t.ppf(1 - alpha / 2, df)
        if stats.nct.sf(crit, df, ncp) + stats.nct.cdf(-crit, df, ncp) >= power:
            return n
    return None


def pooled_sd(*groups):
    num = sum((len(g) - 1) * np.var(g, ddof=1) for g in groups)
    return math.sqrt(num / sum(len(g) - 1 for g in groups))


def t_ci(x, conf=0.95):
    x = np.asarray(x, float)
    half = stats.t.ppf(0.5 + conf / 2, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x))
    return x.mean() - half, x.mean() + half


def test_report_on_the_published_numbers_recommends_running_v58_again(ledger, run_cli):
    res = ok(run_cli("report", "v58", "v59", "v60", "--vs", "v51", "--out", "report.md"))
    md = (ledger / "report.md").read_text()
    diff, lo, hi, p = welch(V58, V51)
    n_closest = runs_to_detect(diff, pooled_sd(V51, V28, V58))
    assert (f"submit none yet: no candidate is shown better than v51 beyond eval noise; the closest, v58, would need "
            f"about {n_closest} runs each to decide") in md and res.stdout.startswith("submit none yet")
    assert p == pytest.approx(stats.ttest_ind(V58, V51, equal_var=False).pvalue, rel=REL)
    assert p > 0.05 and lo < 0 < hi  # independent: within noise, so nothing may be submitted yet
    sd = pooled_sd(V51, V28, V58)
    n58 = runs_to_detect(diff, sd)
    row58 = next(line for line in md.splitlines() if line.startswith("| v58 |"))
    ci58 = t_ci(V58)
    assert row58 == (f"| v58 | 3 | {np.mean(V58):.6g} | [{ci58[0]:.5g}, {ci58[1]:.5g}] | {diff:+.5g} | "
                     f"[{lo:.5g}, {hi:.5g}] | welch p {p:.3g} | within noise | {n58} | not shown better yet |")
    assert n58 == 8
    ci51 = t_ci(V51)
    assert f"| v51 (backbone) | 5 | {np.mean(V51):.6g} | [{ci51[0]:.5g}, {ci51[1]:.5g}] |" in md
    assert (f"about {n58} runs each of v58 and v51 would detect a difference of {abs(diff):.4g} (power 0.8, alpha "
            f"0.05, run noise sd {sd:.4g})") in md
    # the noise sd is pooled over the ledger, and the report says over which models, runs and df (v28 is not shown)
    assert (f"Run noise sd {sd:.4g}, the within-model sd pooled over every model with at least 2 current runs of "
            f"official_total in this eval environment: 3 models (v51, v28, v58), {5 + 2 + 3} runs, "
            f"{4 + 1 + 2} df; of these, in this report: v51, v58.") in md
    for name, value in (("v59", 0.9944), ("v60", 0.9895)):
        d = value - np.mean(V51)
        row = next(line for line in md.splitlines() if line.startswith(f"| {name} |"))
        assert row == (f"| {name} | 1 | {value:.6g} | - | {d:+.5g} | - | - | not enough runs | "
                       f"{runs_to_detect(d, sd)} | not shown better yet |")
        assert min(V51) <= value <= max(V51)
        assert f"its one run lies within v51's runs ({min(V51):.6g} to {max(V51):.6g})" in md
    sub = next(line for line in md.splitlines() if line.startswith("| item_understanding | 0.2453 (n=2)"))
    assert "| +0 | exact (no spread) |" in sub and "| not worse |" in sub  # 0.2453 in every run of both
    assert "v59 recorded no item_understanding" in md and "Gate: none recorded" in md
    assert "Probe and calibration" in md and "None recorded" in md


def test_report_numbers_equal_an_independent_computation(ledger):
    from vecmerge.commands.report import gather
    from vecmerge.workspace.names import Workspace

    d = gather(Workspace(None), ["v58", "v59", "v60"], "v51")
    assert d["recommendation"]["submit"] is None and d["metric"] == "official_total"
    cmp = d["candidates"][0]["comparison"]
    diff, lo, hi, p = welch(V58, V51)
    w = cmp["welch"]
    for got, want in ((w["diff"], diff), (w["ci_low"], lo), (w["ci_high"], hi), (w["p"], p),
                      (cmp["noise_sd"], pooled_sd(V51, V28, V58)), (cmp["a_summary"]["mean"], np.mean(V58))):
        assert got == pytest.approx(want, rel=REL)
    assert [c["advice"] for c in d["candidates"]] == ["not shown better yet"] * 3


def test_report_submits_a_candidate_better_beyond_noise_and_refuses_one_that_costs_a_sub_score(ledger, run_cli):
    good = [1.0420, 1.0390, 1.0450, 1.0410]
    costly = [1.0500, 1.0470, 1.0530]
    ok(run_cli("evidence", "add", "v61", *good, "--metric", "official_total", "--sub",
               "item_understanding=0.2453,0.2453,0.2453,0.2453"))
    ok(run_cli("evidence", "add", "v62", *costly, "--metric", "official_total", "--sub",
               "item_understanding=0.18,0.19,0.17"))
    runner_up = [1.0330, 1.0300, 1.0360]
    ok(run_cli("evidence", "add", "v63", *runner_up, "--metric", "official_total", "--sub",
               "item_understanding=0.2453,0.2453,0.2453"))
    ok(run_cli("report", "v58", "v61", "v62", "v63", "--vs", "v51", "--out", "r.md"))
    md = (ledger / "r.md").read_text()
    assert "submit v61: better than v51 beyond eval noise, and no sub-score worse" in md
    diff, lo, hi, p = welch(good, V51)
    assert lo > 0 and p < 0.05
    assert f"v61 is better than v51 beyond eval noise: {diff:+.5g}, 95% CI [{lo:.5g}, {hi:.5g}], welch p {p:.3g}" in md
    assert "## v62: do not submit" in md
    cost, clo, chi, cp = welch([0.18, 0.19, 0.17], [0.2453] * 5)
    assert chi < 0 and cp < 0.05  # one sub-score in the family: Holm leaves p as it is
    assert (f"it costs a sub-score, worse beyond noise: item_understanding: v62 - v51 = {cost:+.5g} (CI [{clo:.5g}, "
            f"{chi:.5g}], Holm p {cp:.3g})") in md
    assert welch(runner_up, V51)[1] > 0  # v63 is eligible too: the lead of v61 over it is tested and quoted
    lead, llo, lhi, lp = welch(good, runner_up)
    assert llo > 0
    assert (f"over v63, the next eligible candidate: v61 is better beyond eval noise (v61 - v63 = {lead:+.5g}, 95% "
            f"CI [{llo:.5g}, {lhi:.5g}], welch p {lp:.3g})") in md


def test_a_candidate_better_on_the_total_is_never_called_not_shown_better(ledger, run_cli):
    """A stranger's case: v64 is better beyond noise but costs a sub-score, v65 is better but lacks sub-score runs;
    the headline says v64 is better and what holds it back (the trade), not "no candidate is shown better"."""
    costly = [1.0500, 1.0470, 1.0530]
    ok(run_cli("evidence", "add", "v64", *costly, "--metric", "official_total", "--sub",
               "item_understanding=0.18,0.19,0.17"))
    ok(run_cli("report", "v64", "--vs", "v51", "--out", "r.md"))
    md = (ledger / "r.md").read_text()
    diff, lo, hi, p = welch(costly, V51)
    assert lo > 0  # independent: better on the total beyond noise
    assert ("submit none yet: v64 is better than v51 on the total beyond eval noise, but it costs a sub-score beyond "
            "noise (submit it only if that trade is acceptable)") in md
    assert "no candidate is shown better" not in md
    assert (f"v64 is better than v51 on the total beyond eval noise ({diff:+.5g}, 95% CI [{lo:.5g}, {hi:.5g}], welch "
            f"p {p:.3g}), but it costs 1 sub-score(s)") in md
    ok(run_cli("evidence", "add", "v65", 1.0420, 1.0390, 1.0450, 1.0410, "--metric", "official_total"))
    ok(run_cli("report", "v65", "--vs", "v51", "--out", "r2.md"))
    md2 = (ledger / "r2.md").read_text()
    assert welch([1.0420, 1.0390, 1.0450, 1.0410], V51)[1] > 0
    assert ("submit none yet: v65 is better than v51 on the total beyond eval noise, but 1 sub-score(s) not yet shown "
            "not worse (record their runs, or a margin, first)") in md2


def test_report_html_has_its_plots_inline(ledger, run_cli):
    ok(run_cli("report", "v58", "v59", "v60", "--vs", "v51", "--out", "report.md"))
    html = (ledger / "report.html").read_text()
    images = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', html)
    assert len(images) == 2  # the totals, and the sub-scores (item_understanding)
    assert all(base64.b64decode(i)[:8] == b"\x89PNG\r\n\x1a\n" for i in images)
    assert "<script" not in html and 'src="http' not in html
    assert "submit none yet" in html and html.startswith("<!DOCTYPE html>\n<!-- vecmerge report -->")


def test_report_shows_the_plan_state_as_decide_says_it(ledger, run_cli):
    ok(run_cli("evidence", "plan", "v58", "--vs", "v51", "--metric", "official_total", "--min-effect", "0.01",
               "--max-runs", "10"))
    ok(run_cli("evidence", "add", "v58", "1.0300", "1.0250", "--metric", "official_total"))
    ok(run_cli("evidence", "add", "v51", "1.0010", "1.0050", "--metric", "official_total"))
    decide = ok(run_cli("evidence", "decide", "v58", "--vs", "v51", "--json")).stdout
    import json

    want = json.loads(decide)
    ok(run_cli("report", "v58", "--vs", "v51", "--out", "r.md"))
    md = (ledger / "r.md").read_text()
    assert f"decision: {want['decision']}: {want['reason']}" in md
    assert "plan #1: min effect 0.01, at most 10 runs per model" in md
    assert want["power"]["power_d"] is not None  # the ledger's noise sd when the plan was made
    assert f"power (stop_better) when made: {want['power']['power_d']:.1%} at D" in md


@pytest.mark.parametrize("args, words", [
    (["v99", "--vs", "v51"], "no records of v99"),
    (["v58", "--vs", "v51", "--metric", "nope"], "metric 'nope': no records"),
    (["v58", "--vs", "v58"], "name each model once"),
])
def test_report_bad_input_is_one_line_exit_2_and_nothing_written(ledger, run_cli, args, words):
    line = one_error_line(run_cli("report", *args, "--out", "r.md"))
    assert words in line
    assert not (ledger / "r.md").exists() and not (ledger / "r.html").exists()


def test_report_without_records_or_with_a_wrong_out_writes_nothing(tmp_path, monkeypatch, run_cli):
    monkeypatch.chdir(tmp_path)
    assert "no ledger" in one_error_line(run_cli("report", "v58", "--vs", "v51", "--out", "r.md"))
    ok(run_cli("evidence", "add", "v58", "1.0", "1.01", "--metric", "a", "--higher-is-better"))
    ok(run_cli("evidence", "add", "v51", "0.9", "0.91", "--metric", "b", "--higher-is-better"))
    assert "share no metric" in one_error_line(run_cli("report", "v58", "--vs", "v51", "--out", "r.md"))
    assert "no current record of v51 on a" in one_error_line(
        run_cli("report", "v58", "--vs", "v51", "--metric", "a", "--out", "r.md"))
    assert "ending in .md" in one_error_line(run_cli("report", "v58", "--vs", "v51", "--out", "r.txt"))
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("vecmerge-evidence")) == []


def test_report_refuses_an_existing_out_without_force_and_never_replaces_another_file(ledger, run_cli):
    ok(run_cli("report", "v58", "--vs", "v51", "--out", "r.md"))
    first = (ledger / "r.md").read_text()
    assert "already exists; pass --force" in one_error_line(run_cli("report", "v59", "--vs", "v51", "--out", "r.md"))
    assert (ledger / "r.md").read_text() == first
    ok(run_cli("report", "v59", "--vs", "v51", "--out", "r.md", "--force"))
    assert "v59 against v51" in (ledger / "r.md").read_text()
    (ledger / "notes.md").write_text("my notes\n")
    assert "is not a Markdown report vecmerge wrote" in one_error_line(
        run_cli("report", "v58", "--vs", "v51", "--out", "notes.md", "--force"))
    assert (ledger / "notes.md").read_text() == "my notes\n" and not (ledger / "notes.html").exists()
    (ledger / "mine.html").write_text("<p>mine</p>")
    assert "is not a HTML report vecmerge wrote" in one_error_line(
        run_cli("report", "v58", "--vs", "v51", "--out", "mine.md", "--force"))
    assert not (ledger / "mine.md").exists() and (ledger / "mine.html").read_text() == "<p>mine</p>"


def test_the_recommendation_names_a_larger_lead_it_did_not_submit():
    """Stranger finding: the top scorer, refused for a sub-score, vanished from the recommendation that submitted
    another; every other candidate now has its line, the larger lead said so."""
    from vecmerge.commands.recommend import DO_NOT_SUBMIT, SUBMIT, recommend

    def row(name, diff, advice, reason):
        return {"name": name, "comparison": {"decided_by": "welch", "welch": {"diff": diff}}, "advice": advice,
                "reasons": [reason]}

    rows = [row("twin", 0.002, SUBMIT, "better beyond noise"),
            row("tiny", 0.0634, DO_NOT_SUBMIT, "safety: -0.0001 (exact: neither model's runs vary)")]
    out = recommend(rows, "backbone", True)
    assert out["submit"] == "twin"
    assert out["reasons"] == ["twin: better beyond noise",
                              "tiny (do not submit, a larger difference): safety: -0.0001 (exact: neither model's "
                              "runs vary)"]


def test_a_better_total_with_sub_scores_not_yet_shown_not_worse_is_not_submitted():
    """Stranger finding: "submit A" while every sub-score was UNKNOWN; unknown is not a pass, as in the gate."""
    from vecmerge.commands.recommend import NOT_YET, advise

    cmp = {"a": "A", "b": "B", "verdict_code": "a_better", "decided_by": "welch",
           "confidence": 0.95, "welch": {"diff": 0.05, "ci_low": 0.01, "ci_high": 0.09, "p": 0.01, "n": [5, 5]},
           "subscores": {"subscores": {"s": {"status": "unknown", "a_summary": None, "key": "s"}}}}
    advice, reasons = advise(cmp, None)
    assert advice == NOT_YET
    assert any("1 sub-score(s) not yet shown not worse" in r for r in reasons)
    assert reasons[-1] == "A recorded no s: what it costs that sub-score is unknown"


def test_report_shows_one_mcnemar_on_paired_0_1_items_the_exact_one_and_says_it_decided(tmp_path, monkeypatch,
                                                                                         run_cli):
    """Issue 33 follow-up: the paired test's McNemar (chi-square from 25 discordant items) and the registry's exact
    McNemar were both reported; the report shows the exact one, names it as the test that decided, and its p, interval
    and verdict equal scipy's exact binomial test on the discordant items (a single run each: no Welch)."""
    from lm_eval_layout import TASKS, flipped_pair, write_run

    from vecmerge.commands.report import gather
    from vecmerge.workspace.names import Workspace

    monkeypatch.chdir(tmp_path)
    v54, v60 = flipped_pair()
    write_run(tmp_path / "out", "v54", "2026-12-01T10-00-00.000001", v54)
    write_run(tmp_path / "out", "v60", "2026-12-01T10-00-00.000001", v60)
    ok(run_cli("evidence", "import", *sorted(str(f) for f in (tmp_path / "out").rglob("*.json*"))))
    a = [x for t in TASKS for x in v60[t]]
    b = [x for t in TASKS for x in v54[t]]
    n10 = sum(x == 1 and y == 0 for x, y in zip(a, b))
    n01 = sum(x == 0 and y == 1 for x, y in zip(a, b))
    p = stats.binomtest(n10, n10 + n01, 0.5).pvalue
    assert n10 + n01 >= 25 and p < 0.05 and n10 < n01  # v60 lost items: v54 is better, by the exact test
    ok(run_cli("report", "v60", "--vs", "v54", "--metric", "facts/acc", "--out", "r.md"))
    md = (tmp_path / "r.md").read_text()
    assert md.count("McNemar") == 1 and "chi-square" not in md and "paired (" not in md
    assert (f"Test: decided by McNemar's exact test over 120 paired 0/1 items ({n10} only v60 right, {n01} only "
            f"v54): p {p:.3g}.") in md
    row = next(line for line in md.splitlines() if line.startswith("| v60 |"))
    assert f"| mcnemar (exact binomial) p {p:.3g} | v54 is better beyond eval noise |" in row
    assert "## v60: do not submit" in md
    cmp = gather(Workspace(None), ["v60"], "v54", "facts/acc")["candidates"][0]["comparison"]
    assert cmp["paired"] is None and cmp["decided_by"] == "mcnemar" and cmp["verdict_code"] == "b_better"
    assert cmp["mcnemar"]["p"] == pytest.approx(p, rel=1e-12)
    assert cmp["mcnemar"]["diff"] == pytest.approx((n10 - n01) / 120, rel=1e-12)


def test_one_mcnemar_lets_the_exact_test_decide_and_says_when_the_chi_square_row_differed():
    """Where the paired row's chi-square p (0.04) and the exact p (0.06) fall on either side of 0.05, the exact test
    decides, and the note quotes what the dropped row said."""
    from vecmerge.commands.recommend import one_mcnemar

    paired = {"diff": -0.1, "p": 0.04, "method": "McNemar chi-square", "ci_low": -0.2, "ci_high": -0.01,
              "beyond_noise": True}
    exact = {"diff": -0.1, "p": 0.06, "method": "exact binomial", "ci_low": -0.21, "ci_high": 0.004, "n": [100],
             "discordant": [12, 22], "beyond_noise": False}
    cmp = {"a": "A", "b": "B", "metric": "m", "higher_is_better": True, "decided_by": "paired", "paired": paired,
           "mcnemar": exact, "verdict_code": "b_better", "verdict": "B is better beyond eval noise"}
    out = one_mcnemar(cmp)
    assert out["paired"] is None and out["decided_by"] == "mcnemar"
    assert out["verdict_code"] == "within_noise" and out["verdict"] == "within noise"
    assert out["decided_note"] == ("decided by McNemar's exact test over 100 paired 0/1 items (12 only A right, 22 "
                                   "only B): p 0.06; evidence compare's paired row (McNemar chi-square, p 0.04) says "
                                   "B is better beyond eval noise")
    assert cmp["paired"] is paired  # the comparison given is left as it was
    welch_only = {**cmp, "paired": None, "mcnemar": None, "decided_by": "welch"}
    assert one_mcnemar(welch_only) is welch_only
