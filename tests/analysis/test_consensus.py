"""Consensus rows and the gate: signs and cosines against dense float64, the sign test against scipy.

Tolerances: inner products and cosines from factors agree with dense float64 to rtol 1e-9; the
binomial tail is exact (rational arithmetic) and agrees with scipy to rtol 1e-12.
"""

import math
import statistics

import pytest
import torch
from scipy.stats import binom, binomtest

from vecmerge.analysis.consensus import agreement_rows, apply_on_disagree, binom_tail, summarize
from vecmerge.errors import CheckFailed, ExpressionError
from vecmerge.testing import toy_trajectory
from vecmerge.workspace.names import Workspace

DISAGREE = "model.layers.1.mlp.up_proj"


@pytest.fixture
def split(tmp_path, monkeypatch):
    toy_trajectory(tmp_path / "s", disagree=(DISAGREE,))
    monkeypatch.chdir(tmp_path / "s")
    return tmp_path / "s"


def test_rows_against_dense(split, dense_expr):
    ws = Workspace()
    rows = agreement_rows(ws.evaluate("v54 - v54e2"), ws.evaluate("v51 - v28"))
    ref, d = dense_expr({"v54": 1.0, "v54e2": -1.0}), dense_expr({"v51": 1.0, "v28": -1.0})
    assert len(rows) == 14
    for r in rows:
        m = r["module"]
        inner = float((ref[m] * d[m]).sum())
        assert r["inner"] == pytest.approx(inner, rel=1e-9)
        assert r["cosine"] == pytest.approx(inner / float(ref[m].norm() * d[m].norm()), rel=1e-9)
        assert r["agree"] == (inner > 0) and r["agree"] == (m != DISAGREE)
    s = summarize(rows)
    assert (s["modules"], s["agree"], s["disagreeing"]) == (14, 13, [DISAGREE])
    energy = {m: float((x**2).sum()) for m, x in d.items()}
    assert s["agree_energy"] == pytest.approx(1 - energy[DISAGREE] / sum(energy.values()), rel=1e-9)


def test_binomial_tail_against_scipy():
    for k, n in [(196, 196), (120, 196), (98, 196), (0, 5), (3, 3), (7, 20), (13, 14)]:
        want = binomtest(k, n, 0.5, alternative="greater").pvalue
        assert binom_tail(k, n) == pytest.approx(want, rel=1e-12)
    assert binom_tail(14, 14) == 2.0**-14  # one outcome of 2^14


def _rows(signs):
    return [{"module": f"m{i}", "inner": s, "cosine": s, "ref_norm": 1.0, "dir_norm": 1.0, "agree": s > 0}
            for i, s in enumerate(signs)]


def test_decide_fail_drop_keep():
    rows = _rows([1, 1, 1, -1])
    with pytest.raises(CheckFailed, match="1/4 module.*disagree.*m3.*nothing written"):
        apply_on_disagree("r", rows, "fail", None)
    assert apply_on_disagree("r", rows, "drop", None).dropped == ("m3",)
    assert apply_on_disagree("r", rows, "keep", None).dropped == ()
    assert apply_on_disagree("r", _rows([1, 1]), "fail", None).summary["agree"] == 2


def test_a_zero_reference_is_bad_input_not_disagreement(split, run_cli):
    """``--consensus-ref v54 - v54`` (a typo) was "14/14 module(s) disagree ... use --on-disagree drop|keep"
    (exit 1, suggesting to skip the gate); it is an input error naming the flag (exit 2), nothing written."""
    zero = [{**r, "inner": 0.0, "cosine": 0.0, "ref_norm": 0.0, "agree": False} for r in _rows([1, 1])]
    with pytest.raises(ExpressionError, match="--consensus-ref r: is zero in every module"):
        apply_on_disagree("r", zero, "keep", None)
    # one zero module: a row
    assert apply_on_disagree("r", [zero[0], _rows([1, 1])[1]], "keep", None).summary["agree"] == 1
    res = run_cli("project", "--base", "v54", "--dir", "v51-v28", "--trust", "0.01", "--consensus-ref", "v54-v54",
                  "--out", "o")
    lines = res.stderr.strip().splitlines()
    assert res.exit_code == 2 and len(lines) == 1 and "--consensus-ref v54-v54: is zero in every module" in lines[0]
    assert not (split / "o").exists()


def test_min_agree_boundary_is_inclusive():
    """3/4 agree: min_agree 0.75 passes (share >= min_agree), the next float above fails."""
    rows = _rows([1, 1, 1, -1])
    assert apply_on_disagree("r", rows, "keep", 0.75).summary["agree"] == 3
    with pytest.raises(CheckFailed, match=r"3/4 modules agree \(75.0%\) < min_agree"):
        apply_on_disagree("r", rows, "keep", math.nextafter(0.75, 1.0))
    zero = torch.tensor(0.0)
    # a zero inner product disagrees
    assert apply_on_disagree("r", _rows([float(zero)]), "keep", 0.0).summary["agree"] == 0


def _chance_rows(spec):
    """Rows as ``audit.mark_chance`` leaves them: (inner, ref_norm, dir_norm, null_std, mark[, missing])."""
    rows = []
    for i, (inner, rn, dn, std, mark, *missing) in enumerate(spec):
        cos = inner / (rn * dn) if rn > 0 and dn > 0 else 0.0
        rows.append({"module": f"m{i}", "inner": inner, "cosine": cos, "ref_norm": rn, "dir_norm": dn,
                     "agree": inner > 0, "null_std": std, "chance": mark == "chance", "mark": mark,
                     **({"missing": ["a"]} if missing else {})})
    return rows


def test_summary_figures_against_their_formulas():
    """Every summary figure recomputed by hand (statistics, math.fsum, scipy's binomial test) from rows with unequal
    norms and null widths; a missing module counts only in the whole-vector figures. rtol 1e-12."""
    spec = [(0.6, 2.0, 0.5, 0.1, "agree"), (-0.3, 1.5, 1.0, 0.2, "disagree"), (0.02, 1.0, 3.0, 0.3, "chance"),
            (0.9, 3.0, 0.4, 0.05, "agree"), (-0.4, 0.5, 2.0, 0.1, "chance"), (0.2, 1.0, 1.0, 0.1, "missing", 1)]
    rows = _chance_rows(spec)
    s = summarize(rows)
    counted = rows[:5]
    cos = [r["cosine"] for r in counted]
    assert (s["modules"], s["agree"], s["disagree"], s["not_compared"]) == (6, 3, 2, 1)
    assert s["cosine_median"] == statistics.median(cos) and (s["cosine_min"], s["cosine_max"]) == (min(cos), max(cos))
    e = [r["dir_norm"] ** 2 for r in counted]
    assert s["agree_energy"] == pytest.approx((e[0] + e[2] + e[3]) / math.fsum(e), rel=1e-12)
    assert (s["agree_significant"], s["disagree_significant"], s["chance"]) == (2, 1, 2)
    assert s["binom_p"] == pytest.approx(binomtest(3, 5, 0.5, alternative="greater").pvalue, rel=1e-12)
    assert s["binom_p_significant"] == pytest.approx(binomtest(2, 3, 0.5, alternative="greater").pvalue, rel=1e-12)
    inner = math.fsum(r["inner"] for r in rows)
    rn = math.sqrt(math.fsum(r["ref_norm"] ** 2 for r in rows))
    dn = math.sqrt(math.fsum(r["dir_norm"] ** 2 for r in rows))
    var = math.fsum((r["ref_norm"] * r["dir_norm"] * r["null_std"]) ** 2 for r in rows)
    assert s["global_inner"] == pytest.approx(inner, rel=1e-12)
    assert s["global_cosine"] == pytest.approx(inner / (rn * dn), rel=1e-12)
    assert s["global_z"] == pytest.approx(inner / math.sqrt(var), rel=1e-12)
    assert var < 1  # a small variance (sub-unit norms and widths) still divides


def test_summary_of_zero_and_empty_inputs_is_zero_not_an_error():
    """No energy, no compared module, a zero side: the shares, cosines and z are 0, never a division by zero."""
    zero_dir = summarize(_chance_rows([(0.0, 1.0, 0.0, 0.1, "chance"), (0.0, 2.0, 0.0, 0.1, "chance")]))
    assert (zero_dir["agree_energy"], zero_dir["global_cosine"], zero_dir["global_z"]) == (0.0, 0.0, 0.0)
    zero_ref = summarize(_chance_rows([(0.0, 0.0, 1.0, 0.1, "chance")]))
    assert (zero_ref["global_cosine"], zero_ref["global_z"]) == (0.0, 0.0)
    gone = summarize(_chance_rows([(0.5, 1.0, 1.0, 0.1, "missing", 1), (0.5, 1.0, 1.0, 0.1, "missing", 1)]))
    assert (gone["cosine_median"], gone["cosine_min"], gone["cosine_max"], gone["agree_energy"]) == (0.0,) * 4
    assert (gone["agree"], gone["disagree"], gone["not_compared"], gone["binom_p"]) == (0, 0, 2, 1.0)
    assert gone["global_cosine"] == pytest.approx(0.5, rel=1e-12)  # whole vectors still compare: 1 / (sqrt2 sqrt2)


def test_binomial_tail_small_and_out_of_range_counts():
    """P(X >= k) for k <= 0 is 1 (at any n, n = 0 too); small n against scipy (rtol 1e-12)."""
    for k, n in [(1, 1), (1, 3), (2, 2), (1, 2)]:
        assert binom_tail(k, n) == pytest.approx(binomtest(k, n, 0.5, alternative="greater").pvalue, rel=1e-12)
    assert binom_tail(0, 0) == 1.0 and binom_tail(-1, 5) == 1.0 and binom_tail(0, 7) == 1.0


def test_binomial_tail_is_the_survival_function_at_every_count():
    """``P(X >= k) = binom.sf(k - 1, n, 1/2)`` (scipy) for every k from below 0 to beyond n: 1 for k <= 0, 0 for
    k > n, also with no trial at all (n = 0, k = 1 was once 1). rtol 1e-12, atol 0."""
    for n in range(0, 9):
        for k in range(-1, n + 3):
            assert binom_tail(k, n) == pytest.approx(float(binom.sf(k - 1, n, 0.5)), rel=1e-12, abs=0), (k, n)
    assert binom_tail(1, 0) == 0.0 and binom_tail(0, 0) == 1.0


def test_decide_keeps_its_settings_and_refuses_no_modules():
    rows = _rows([1, -1, 1])
    res = apply_on_disagree("v54 - v54e2", rows, "drop", 0.5)
    assert (res.ref, res.on_disagree, res.min_agree, res.rows, res.dropped) == ("v54 - v54e2", "drop", 0.5, rows,
                                                                                 ("m1",))
    d = res.to_dict()
    assert (d["ref"], d["on_disagree"], d["min_agree"], d["rows"]) == ("v54 - v54e2", "drop", 0.5, rows)
    assert {k: d[k] for k in res.summary} == res.summary
    with pytest.raises(CheckFailed, match=r"0/0 modules agree \(0.0%\) < min_agree 0.5"):
        apply_on_disagree("r", [], "keep", 0.5)  # nothing to agree: no share reaches min_agree


def test_rows_need_no_svd_report_progress_and_name_experts(split, monkeypatch):
    """The gate's rows take norms from the factors (no SVD), pass every module through ``progress``, and an
    expert of a MoE parameter carries its index and its parameter as type (``direction.specs``)."""
    from types import SimpleNamespace

    from vecmerge.linalg.lowrank import LowRank
    from vecmerge.workspace.taskvector import TaskVector

    ws = Workspace()
    ref, d = ws.evaluate("v54 - v54e2"), ws.evaluate("v51 - v28")
    seen = []

    def progress(names):
        seen.extend(names)
        return names

    def no_svd(self):
        raise AssertionError("agreement_rows computed singular values")

    monkeypatch.setattr(LowRank, "singular_values", no_svd)
    rows = agreement_rows(ref, d, progress=progress)
    assert seen == d.names() and [r["module"] for r in rows] == d.names()
    monkeypatch.undo()
    m = d.names()[0]
    e0, e1 = "model.layers.0.mlp.experts.gate_up_proj.0", "model.layers.0.mlp.experts.gate_up_proj.1"
    specs = {e: SimpleNamespace(expert=i, target="model.layers.0.mlp.experts.gate_up_proj") for i, e in
             enumerate((e0, e1))}
    moe_d, moe_r = TaskVector({e0: d[m], e1: d[m] * 2.0}, specs), TaskVector({e0: ref[m], e1: ref[m]}, specs)
    rows = agreement_rows(moe_r, moe_d)
    assert [(r["expert"], r["type"]) for r in rows] == [(0, "gate_up_proj"), (1, "gate_up_proj")]


def test_a_module_zero_on_either_side_has_no_sign_and_is_not_compared(split, run_cli):
    """A module that is exactly zero in the direction, or zero within round-off in the reference (v - v of
    identical factors: about 1e-16 of its terms), has no sign: it is neither agreeing nor disagreeing, the
    share is over the signed modules, and the audit names it (stranger test finding F3)."""
    import shutil

    from safetensors.torch import load_file, save_file

    exact, roundoff = "model.layers.0.self_attn.q_proj", "model.layers.0.mlp.down_proj"
    key = "base_model.model.{}.lora_{}.weight"

    def edited(src, dst, change):
        shutil.copytree(split / src, split / dst)
        f = split / dst / "adapter_model.safetensors"
        t = load_file(f)
        change(t)
        save_file(t, f)

    for src in ("v51", "v28"):  # the direction v51z - v28z is exactly zero in `exact`
        edited(src, src + "z", lambda t: t[key.format(exact, "B")].zero_())
    v54 = load_file(split / "v54" / "adapter_model.safetensors")

    def same_as_v54(t):  # v54 - v54same cancels in `roundoff` only up to float64 round-off
        for ab in "AB":
            t[key.format(roundoff, ab)] = v54[key.format(roundoff, ab)].clone()

    edited("v54e2", "v54same", same_as_v54)
    ws = Workspace()
    ref, d = ws.evaluate("v54 - v54same"), ws.evaluate("v51z - v28z")
    assert 0 < ref[roundoff].norm() < 1e-12 * ws.evaluate("v54")[roundoff].norm()  # round-off, not exactly zero
    rows = {r["module"]: r for r in agreement_rows(ref, d)}
    for m in (exact, roundoff):
        assert rows[m]["zero"] and (rows[m]["inner"], rows[m]["cosine"], rows[m]["agree"]) == (0.0, 0.0, False)
    assert not any(r.get("zero") for m, r in rows.items() if m not in (exact, roundoff))
    s = summarize(list(rows.values()))
    assert (s["modules"], s["not_compared"], s["zero"], s["agree"], s["disagree"]) == (14, 2, 2, 11, 1)
    assert s["disagreeing"] == [DISAGREE]
    with pytest.raises(CheckFailed, match=r"1/14 module\(s\) disagree") as e:
        apply_on_disagree("ref", list(rows.values()), "fail", None)
    assert exact not in str(e.value) and roundoff not in str(e.value)
    assert apply_on_disagree("ref", list(rows.values()), "keep", 11 / 12).summary["agree"] == 11  # share over 12 signed
    with pytest.raises(CheckFailed, match=r"11/12 modules agree"):
        apply_on_disagree("ref", list(rows.values()), "keep", 0.95)
    # every module zero within round-off only (no side exactly zero): no sign anywhere, an error, not a pass
    v54same_all = [dict(r, zero=True) for r in rows.values()]
    with pytest.raises(CheckFailed, match="every module is zero"):
        apply_on_disagree("v54 - v54same", v54same_all, "keep", None)
    live = ws.evaluate("v51 - v28")
    swapped = {r["module"]: r for r in agreement_rows(live, ref)}  # the direction's side is tested too
    assert swapped[roundoff]["zero"] and not swapped[exact].get("zero") and live[roundoff].norm() > 0
    out = run_cli("audit", "--ref", "v54-v54same", "--dir", "v51z-v28z").output
    assert "11/12 modules agree in sign" in out and "not compared: 2 module(s) zero in the ref or the dir" in out
    assert "opposite sign: " + DISAGREE in out


def test_zero_is_relative_to_the_round_off_floor_of_factors_and_cores():
    """``is_zero``: ``||x|| <= EXACT_RTOL * floor`` with floor ``|s| ||B||_F ||A||_F`` (LowRank) or the core's
    ``floor`` (InSpan); a small real update far from 1 in scale is not zero, a cancellation is."""
    from vecmerge.analysis.consensus import is_zero, roundoff_floor
    from vecmerge.linalg.lowrank import EXACT_RTOL, LowRank
    from vecmerge.linalg.subspace import InSpan

    g = torch.Generator().manual_seed(0)
    B, A = 1e-3 * torch.randn(16, 2, generator=g, dtype=torch.float64), 1e-3 * torch.randn(2, 12, generator=g,
                                                                                           dtype=torch.float64)
    x = LowRank(B, A, 0.5)
    assert roundoff_floor(x) == pytest.approx(0.5 * float(B.norm()) * float(A.norm()), rel=1e-12)  # ~1e-6
    assert not is_zero(x, x.norm()) and not is_zero(x, 1e-6 * roundoff_floor(x))  # small, but 1e3 x the bound
    assert is_zero(x, EXACT_RTOL * roundoff_floor(x)) and not is_zero(x, 1.01 * EXACT_RTOL * roundoff_floor(x))
    cancel = LowRank(torch.cat([B, B], 1), torch.cat([A, -A], 0), 0.5)  # s B A - s B A, stacked
    assert is_zero(cancel, cancel.norm()) and is_zero(LowRank.zeros((16, 12)), 0.0)
    core = InSpan(torch.full((2, 2), 1e-20, dtype=torch.float64), None, floor=1e-8)
    assert roundoff_floor(core) == 1e-8 and is_zero(core, core.norm())
    assert not is_zero(InSpan(torch.full((2, 2), 1e-12, dtype=torch.float64), None, floor=1e-8), 2e-12)
    assert is_zero(InSpan(torch.zeros(2, 2, dtype=torch.float64), None, floor=0.0), 0.0)


def test_zero_and_missing_rows_are_counted_once_and_missing_ones_count_against_the_share():
    """A module missing in an input is read as zero: it is ``missing`` (counts against the share), not ``zero``."""
    from vecmerge.analysis.consensus import check_not_zero
    from vecmerge.errors import ExpressionError

    row = {"layer": 0, "type": "q_proj", "shape": [4, 4], "inner": 1.0, "cosine": 0.5, "ref_norm": 1.0,
           "dir_norm": 2.0, "agree": True}
    rows = [dict(row, module="a"), dict(row, module="b"),
            dict(row, module="z", inner=0.0, cosine=0.0, agree=False, zero=True),
            dict(row, module="m", inner=0.0, cosine=0.0, dir_norm=0.0, agree=False, zero=True, missing=True)]
    s = summarize(rows)
    assert (s["modules"], s["agree"], s["disagree"], s["not_compared"], s["zero"]) == (4, 2, 0, 2, 1)
    with pytest.raises(CheckFailed, match=r"2/3 modules agree"):  # over 4 - 1 zero: the missing one counts
        apply_on_disagree("ref", rows, "keep", 0.9)
    # the reference zero in every compared module is bad input, even where a missing module's is not
    flat = [dict(row, module="a", ref_norm=0.0), dict(row, module="m", missing=True)]
    with pytest.raises(ExpressionError, match=r"--consensus-ref v - v: is zero in every module"):
        check_not_zero(flat, "v - v", ref_flag="--consensus-ref")
    check_not_zero([dict(row, module="a")], "v - w")  # a live reference passes
