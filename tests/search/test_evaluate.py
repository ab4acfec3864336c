"""The paired figures and the judgement against statistics computed here; the scorer against probe; the ledger."""

from __future__ import annotations

import json
import math
import statistics
from types import SimpleNamespace

import pytest
import torch

from vecmerge.evidence.ledger.ledger import Ledger
from vecmerge.peft.adapter import Adapter
from vecmerge.probe.hooks import module_updates
from vecmerge.probe.prompts import read_prompts
from vecmerge.probe.runner import ProbeModel, load_base, run_probe
from vecmerge.search.evaluate import Scorer, Z, cached, judge, paired, record


def _scores(values):
    return {str(i): {"loglik": v, "exact": 0, "first_rank": 1} for i, v in enumerate(values)}


def test_paired_is_the_mean_and_standard_error_of_the_per_item_changes():
    before, after = [-1.0, -2.0, -0.5, -3.0], [-0.9, -2.5, -0.4, -2.0]
    f = paired(_scores(after), _scores(before))
    d = [a - b for a, b in zip(after, before)]
    se = statistics.stdev(d) / math.sqrt(len(d))
    assert f.mean == pytest.approx(statistics.mean(d), abs=1e-15) and f.se == pytest.approx(se, rel=1e-12)
    assert f.lower == pytest.approx(statistics.mean(d) - 1.645 * se, rel=1e-12) and Z == 1.645 and f.n == 4


def test_judge_holds_each_protected_set_to_its_margin_on_the_lower_bound_and_the_step_to_trust_max():
    c = SimpleNamespace(sha256="a" * 64, params={}, recipe={}, problem=None)
    built = SimpleNamespace(alpha=1.0, step=0.05, kept_direction=1.0)
    before = {"t": _scores([0, 0, 0]), "p": _scores([0, 0, 0])}
    after = {"t": _scores([1, 2, 3]), "p": _scores([-0.01, -0.02, -0.03])}  # mean -0.02, SE 0.00577, lower -0.0295
    kw = dict(targets=["t"], protect=["p"], trust_max=0.1, computed=True)
    ok = judge(c, built, after, before, margins={"p": 0.04}, **kw)
    assert ok.feasible and ok.objective == pytest.approx(2.0) and ok.worst == pytest.approx(-0.02)
    tight = judge(c, built, after, before, margins={"p": 0.025}, **kw)  # the mean passes, the bound does not
    assert not tight.feasible and "lower bound" in tight.violations[0]
    assert tight.constraints({"p": 0.025}, 0.1)[0] > 0 >= ok.constraints({"p": 0.04}, 0.1)[0]
    far = judge(c, SimpleNamespace(alpha=1.0, step=0.2, kept_direction=1.0), after, before, margins={"p": 0.04}, **kw)
    assert not far.feasible and "trust_max" in far.violations[0]
    # per-set margins: the worst set is the one nearest its own margin (q: lower -0.0295 + 0.03), not the lowest
    # mean (p2: -0.2, margin 1); the slack is that distance
    two = {**after, "q": after["p"], "p2": _scores([-0.1, -0.2, -0.3])}
    r = judge(c, built, two, {**before, "q": before["p"], "p2": before["p"]}, margins={"q": 0.03, "p2": 1.0},
              **{**kw, "protect": ["q", "p2"]})
    lower = -0.02 - 1.645 * statistics.stdev([-0.01, -0.02, -0.03]) / math.sqrt(3)
    assert r.feasible and r.worst_set == "q" and r.worst == pytest.approx(-0.02)
    assert r.slack == pytest.approx(lower + 0.03, abs=1e-12) and r.to_dict()["worst_lower"] == pytest.approx(lower)
    none = judge(SimpleNamespace(**{**vars(c), "problem": "every module is excluded"}), None, {}, {},
                 margins={"p": 0.04}, **kw)
    assert not none.feasible and none.violations == ["every module is excluded"]


@pytest.fixture
def probe_setup(tmp_path, tiny_base, peft_adapter):
    path = tmp_path / "items.jsonl"
    path.write_text("".join(json.dumps({"id": i, "prompt_ids": [1 + i, 2, 3][: 1 + i % 3], "target_ids": [4, 5 + i]})
                            + "\n" for i in range(7)))
    return read_prompts(path, stem="s"), tiny_base, peft_adapter("ev", 3)


def test_the_scorer_gives_probes_logliks_and_the_ledger_keeps_them(probe_setup, tmp_path):
    ps, base, folder = probe_setup
    adapter = Adapter(folder)
    model = load_base(base, torch.device("cpu"))
    scorer = Scorer(model, adapter.modules, {"s": ps}, batch=3)
    got = scorer.scores(module_updates(adapter, model, device="cpu"))["s"]
    scorer.close()
    ref = run_probe(base, [ProbeModel("x", adapter, "b" * 64)], ps, batch=2).models["x"]["items"]
    for i in ps.ids:
        assert got[i]["loglik"] == pytest.approx(ref[i]["loglik"], rel=1e-5, abs=1e-6)
        assert got[i]["first_rank"] == ref[i]["first_rank"]
    ledger = Ledger(tmp_path / "l.db")
    assert cached(ledger, {"s": ps}, "search-x", "c" * 64) == {}
    assert record(ledger, {"s": ps}, "search-x", "c" * 64, {"s": got}) == 3 * len(ps.ids)
    back = cached(ledger, {"s": ps}, "search-x", "c" * 64)["s"]
    assert {i: v["loglik"] for i, v in back.items()} == {i: v["loglik"] for i, v in got.items()}
    assert cached(ledger, {"s": ps}, "search-x", "d" * 64) == {}  # another recipe hash holds nothing
