"""The probe's ledger records: names, the source that ties them to the prompt file's bytes, finite pairs only."""

from __future__ import annotations

import json
import math

from vecmerge.probe import records
from vecmerge.probe.prompts import read_prompts

SHA_A, SHA_B = "a" * 64, "b" * 64


def prompts(tmp_path):
    f = tmp_path / "set.jsonl"
    f.write_text("".join(json.dumps({"id": f"q{i}", "prompt_ids": [1], "target_ids": [2], "cluster": "c",
                                     "task": "t"}) + "\n" for i in range(2)))
    return read_prompts(f)


def test_names_source_and_directions(tmp_path):
    ps = prompts(tmp_path)
    assert records.metric("set", "loglik") == "probe:set:loglik"
    assert records.source(ps) == f"probe:set.jsonl@{ps.sha256}"
    assert records.directions("set") == {"probe:set:loglik": True, "probe:set:loglik_per_token": True,
                                         "probe:set:exact": True, "probe:set:first_rank": False}
    entries = records.item_entries(ps, "m", SHA_A, {"q0": {"loglik": -1.5, "exact": 1, "first_rank": 2}})
    assert [(e.metric, e.value, e.item, e.cluster) for e in entries] == [
        ("probe:set:loglik", -1.5, "q0", "c"), ("probe:set:exact", 1.0, "q0", "c"),
        ("probe:set:first_rank", 2.0, "q0", "c")]


def test_an_infinite_divergence_is_not_recorded(tmp_path):
    ps = prompts(tmp_path)
    rows = records.pair_entries(ps, ("a", SHA_A), ("b", SHA_B), {
        "q0": {"kl_ab": 0.1, "kl_ba": 0.2, "js": 0.05}, "q1": {"kl_ab": math.inf, "kl_ba": 0.3, "js": 0.1}})
    assert [(r.metric, r.item, r.model_a, r.value) for r in rows] == [
        ("probe:set:kl", "q0", "a", 0.1), ("probe:set:kl", "q0", "b", 0.2), ("probe:set:js", "q0", "a", 0.05)]
