"""Consensus rows and the gate: signs and cosines against dense float64, the sign test against scipy.

Tolerances: inner products and cosines from factors agree with dense float64 to rtol 1e-9; the
binomial tail is exact (rational arithmetic) and agrees with scipy to rtol 1e-12.
"""

import math

import pytest
import torch
from scipy.stats import binomtest

from vecmerge.consensus import agreement_rows, binom_tail, decide, summarize
from vecmerge.errors import CheckFailed, ExpressionError
from vecmerge.testing import toy_trajectory
from vecmerge.workspace import Workspace

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
        decide("r", rows, "fail", None)
    assert decide("r", rows, "drop", None).dropped == ("m3",)
    assert decide("r", rows, "keep", None).dropped == ()
    assert decide("r", _rows([1, 1]), "fail", None).summary["agree"] == 2


def test_a_zero_reference_is_bad_input_not_disagreement(split, run_cli):
    """``--consensus-ref v54 - v54`` (a typo) was "14/14 module(s) disagree ... use --on-disagree drop|keep"
    (exit 1, suggesting to skip the gate); it is an input error naming the flag (exit 2), nothing written."""
    zero = [{**r, "inner": 0.0, "cosine": 0.0, "ref_norm": 0.0, "agree": False} for r in _rows([1, 1])]
    with pytest.raises(ExpressionError, match="--consensus-ref r: is zero in every module"):
        decide("r", zero, "keep", None)
    assert decide("r", [zero[0], _rows([1, 1])[1]], "keep", None).summary["agree"] == 1  # one zero module: a row
    res = run_cli("project", "--base", "v54", "--dir", "v51-v28", "--trust", "0.01", "--consensus-ref", "v54-v54",
                  "--out", "o")
    lines = res.stderr.strip().splitlines()
    assert res.exit_code == 2 and len(lines) == 1 and "--consensus-ref v54-v54: is zero in every module" in lines[0]
    assert not (split / "o").exists()


def test_min_agree_boundary_is_inclusive():
    """3/4 agree: min_agree 0.75 passes (share >= min_agree), the next float above fails."""
    rows = _rows([1, 1, 1, -1])
    assert decide("r", rows, "keep", 0.75).summary["agree"] == 3
    with pytest.raises(CheckFailed, match=r"3/4 modules agree \(75.0%\) < min_agree"):
        decide("r", rows, "keep", math.nextafter(0.75, 1.0))
    zero = torch.tensor(0.0)
    assert decide("r", _rows([float(zero)]), "keep", 0.0).summary["agree"] == 0  # a zero inner product disagrees
