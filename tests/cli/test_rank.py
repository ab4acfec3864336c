"""``evidence calibrate --loo`` and ``vecmerge rank`` through the CLI, over a ledger of constructed past models."""

from __future__ import annotations

import json

import numpy as np
import pytest

RNG = np.random.default_rng(2)
TRUE = np.linspace(0.90, 1.02, 10)


@pytest.fixture
def ledger(tmp_path, monkeypatch, run_cli):
    monkeypatch.chdir(tmp_path)
    for i, t in enumerate(TRUE):
        runs = [f"{t + RNG.normal(0, 0.003):.6f}" for _ in range(3)]
        assert run_cli("evidence", "add", f"m{i}", *runs, "--metric", "official", "--higher-is-better").exit_code == 0
        proxy = f"{-40 + 50 * t + RNG.normal(0, 0.2):.6f}"
        assert run_cli("evidence", "add", f"m{i}", "--metric", "probe:x:loglik", "--", proxy).exit_code == 0
        noise = f"{RNG.normal(0, 1):.6f}"
        assert run_cli("evidence", "add", f"m{i}", "--metric", "noise", "--", noise).exit_code == 0
    for name, value in (("good", "11.5"), ("fine", "10.0"), ("broken", "-60")):
        assert run_cli("evidence", "add", name, "--metric", "probe:x:loglik", "--", value).exit_code == 0
        assert run_cli("evidence", "add", name, "--metric", "noise", "--", "0.0").exit_code == 0
    return tmp_path


def ok(res, code: int = 0):
    assert res.exit_code == code, res.output
    return res


def test_calibrate_loo_text_and_json(ledger, run_cli):
    text = ok(run_cli("evidence", "calibrate", "--proxy", "probe:x:loglik", "--target", "official", "--loo")).output
    assert "each of 10 models left out of its own fit" in text and "held-out Spearman rho" in text
    assert "verdict: ranks candidates" in text and "m9" in text
    d = json.loads(ok(run_cli("evidence", "calibrate", "--proxy", "probe:x:loglik,noise", "--target", "official",
                              "--loo", "--json")).output)
    assert d["proxies"] == ["probe:x:loglik", "noise"] and len(d["held_out"]) == 10 and d["loo"] is True
    res = ok(run_cli("evidence", "calibrate", "--proxy", "probe:x:loglik,noise", "--target", "official"), 2)
    assert "add --loo" in res.output and len(res.output.strip().splitlines()) == 1
    res = ok(run_cli("evidence", "calibrate", "--proxy", "probe:x:loglik,", "--target", "official", "--loo"), 2)
    assert "each once" in res.output


def test_rank_with_a_passing_calibration_and_without(ledger, run_cli):
    text = ok(run_cli("rank", "fine", "good", "broken", "--proxy", "probe:x:loglik", "--target", "official")).output
    assert text.startswith("rank 3 candidates by predicted official") and "verdict: ranks candidates" in text
    d = json.loads(ok(run_cli("rank", "fine", "good", "broken", "--proxy", "probe:x:loglik", "--target", "official",
                              "--json")).output)
    assert [r["candidate"] for r in d["rows"]] == ["good", "fine", "broken"] and d["mode"] == "ranking"
    assert d["calibration"]["models"] == [f"m{i}" for i in range(10)]  # the candidates are not past models
    text = ok(run_cli("rank", "fine", "good", "broken", "--proxy", "probe:x:loglik")).output
    assert "disaster detector only, not a ranking" in text
    assert "far below the others (modified z < -3.5): broken" in text
    text = ok(run_cli("rank", "fine", "good", "--proxy", "noise", "--target", "official")).output
    assert "verdict: disaster detector only" in text and "calibration against official says" in text
    res = ok(run_cli("rank", "fine", "nobody", "--proxy", "probe:x:loglik"), 2)
    assert "no current whole-run record of nobody (probe:x:loglik)" in res.output and "vecmerge probe" in res.output
    assert "name each candidate once" in ok(run_cli("rank", "fine", "fine", "--proxy", "noise"), 2).output
    assert "is also a --proxy" in ok(run_cli("rank", "fine", "--proxy", "noise", "--target", "noise"), 2).output


def test_each_metric_is_read_in_one_eval_environment(ledger, run_cli):
    """Target runs of a second environment: calibrate --loo and rank refuse to pool them; --env picks one."""
    for i in range(3):
        ok(run_cli("evidence", "add", f"m{i}", "0.5", "0.6", "--metric", "official", "--env", "timeout=180"))
    res = ok(run_cli("evidence", "calibrate", "--proxy", "probe:x:loglik", "--target", "official", "--loo"), 2)
    assert "official" in res.output and "timeout" in res.output and len(res.output.strip().splitlines()) == 1
    res = ok(run_cli("rank", "fine", "good", "--proxy", "probe:x:loglik", "--target", "official"), 2)
    assert "timeout" in res.output
    import re

    plain = re.search(r"unrecorded in ([0-9a-f]{12})", res.output).group(1)  # the environment without fields
    d = json.loads(ok(run_cli("evidence", "calibrate", "--proxy", "probe:x:loglik", "--target", "official", "--loo",
                              "--env", plain, "--json")).output)
    assert d["models"] == [f"m{i}" for i in range(10)] and d["verdict"] == "ranks candidates"
    assert d["environments"]["official"]["id"].startswith(plain)
    d = json.loads(ok(run_cli("rank", "fine", "good", "--proxy", "probe:x:loglik", "--target", "official", "--env",
                              plain, "--json")).output)
    assert d["mode"] == "ranking"
