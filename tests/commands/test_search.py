"""``vecmerge search``'s bad input (issue 35, item 7): one line, exit 2, nothing written (no output, no ledger)."""

from __future__ import annotations

import json

import pytest


def _prompts(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path.name


@pytest.fixture
def ws(tmp_path, monkeypatch, peft_adapter, tiny_base):
    """A folder with adapters a and b on the tiny base, a target set and two protected sets (token ids)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "vecmerge.yaml").write_text(f"adapters:\n  a: {peft_adapter('sa', 1)}\n  b: {peft_adapter('sb', 2)}\n")
    _prompts(tmp_path / "t.jsonl", [{"id": i, "prompt_ids": [1, i + 2], "target_ids": [40]} for i in range(6)])
    _prompts(tmp_path / "p.jsonl", [{"id": i, "prompt_ids": [3, i + 10], "target_ids": [41]} for i in range(6)])
    return tmp_path, tiny_base


def _search(run_cli, base_model, *extra, target="t=t.jsonl", protect="p=p.jsonl", margin="0.1", budget="2",
            direction="b - a"):
    return run_cli("search", "--base", "a", "--dir", direction, "--target", target, "--protect", protect,
                   "--margin", margin, "--trust-max", "0.1", "--budget", budget, "--sampler", "grid",
                   "--base-model", base_model, "--out-dir", "out", *extra)


def _refused(res, root, *words):
    assert res.exit_code == 2, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), res.output
    for w in words:
        assert w in lines[0], lines[0]
    assert not (root / "out").exists() and not (root / "vecmerge-evidence.db").exists()


def test_a_protected_set_sharing_prompts_with_the_target_is_refused(ws, run_cli):
    root, base = ws
    _prompts(root / "q.jsonl", [{"id": "x", "prompt_ids": [1, 4], "target_ids": [9]}])  # t's item 2
    _refused(_search(run_cli, base, protect="q=q.jsonl"), root, "q.jsonl", "1 of its prompts", "target")


def test_a_margin_below_zero_is_refused(ws, run_cli):
    root, base = ws
    _refused(_search(run_cli, base, margin="-0.1"), root, "--margin", ">= 0")


def test_a_budget_of_zero_is_refused(ws, run_cli):
    root, base = ws
    _refused(_search(run_cli, base, budget="0"), root, "--budget 0")


def test_an_unknown_direction_is_refused(ws, run_cli):
    root, base = ws
    _refused(_search(run_cli, base, direction="nosuch - a"), root, "nosuch")


def test_prompts_the_model_cannot_read_are_refused(ws, run_cli):
    root, base = ws
    _prompts(root / "w.jsonl", [{"id": 1, "prompt": "hello", "target": " world"}])
    _refused(_search(run_cli, base, protect="w=w.jsonl"), root, "w.jsonl", "tokenizer")
    _prompts(root / "v.jsonl", [{"id": 1, "prompt_ids": [3, 5000], "target_ids": [4]}])
    _refused(_search(run_cli, base, protect="v=v.jsonl"), root, "v.jsonl", "vocabulary")


def test_a_search_on_random_adapters_writes_its_record_and_top_k(ws, run_cli):
    """End to end on random adapters (no trained signal): the record, the PNG, the written candidates."""
    root, base = ws
    res = _search(run_cli, base, "--top", "1", "--json", margin="1000", budget="3")
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    assert d["evaluated"] == 3 and d["computed"] == 3 and len(d["top"]) == 1
    assert (root / "out" / "search.json").is_file() and (root / "out" / "front.png").is_file()
    assert (root / "out" / "top1" / "adapter_model.safetensors").is_file()


RECIPE = ("base: a\ndir: [b - a]\ntarget: {t: t.jsonl}\nprotect: {p: p.jsonl}\nmargin: 1000\ntrust_max: 0.1\n"
          "budget: 3\nsampler: grid\ntop: 1\nbase_model: {base}\nout_dir: out\n")


def test_a_recipe_run_equals_the_flag_run_and_records_the_file(ws, run_cli):
    """The same inputs by flags and by --recipe: the same search id and candidates (computed afresh both times)."""
    import hashlib

    root, base = ws
    flags = _search(run_cli, base, "--top", "1", "--json", margin="1000", budget="3")
    assert flags.exit_code == 0, flags.output
    (root / "vecmerge-evidence.db").unlink()  # the recipe run computes every candidate again
    (root / "s.yaml").write_text(RECIPE.replace("{base}", str(base)))
    res = run_cli("search", "--recipe", "s.yaml", "--out-dir", "out2", "--json")
    assert res.exit_code == 0, res.output
    a, b = json.loads(flags.stdout), json.loads(res.stdout)
    assert b["computed"] == 3 and a["id"] == b["id"] and a["space"] == b["space"]
    assert a["candidates"] == b["candidates"] and a["top"] == b["top"]
    record = json.loads((root / "out2" / "search.json").read_text())
    assert record["recipe_file"] == {"path": "s.yaml", "sha256": hashlib.sha256((root / "s.yaml").read_bytes())
                                     .hexdigest(), "keys": [k.split(":")[0] for k in RECIPE.splitlines()],
                                     "overridden": ["out_dir"]}
    assert "recipe_file" not in json.loads((root / "out" / "search.json").read_text())


def test_a_recipe_with_bad_keys_is_one_line_and_nothing_is_written(ws, run_cli):
    root, base = ws
    (root / "s.yaml").write_text(RECIPE.replace("{base}", str(base)).replace("trust_max", "trust")
                                 .replace("budget: 3", "budget: three").replace("base: a\n", ""))
    res = run_cli("search", "--recipe", "s.yaml")
    _refused(res, root, "s.yaml: ", "unknown key 'trust' (did you mean 'trust_max'?)",
             "budget: expected an integer, got 'three'", "no base: give base: in the file or --base")
    res = run_cli("search", "--recipe", "s.yaml", "--base", "a", "--trust-max", "0.1", "--budget", "3")
    _refused(res, root, "unknown key 'trust'", "budget: expected an integer")  # the file is checked whole
    _refused(run_cli("search", "--recipe", "nosuch.yaml"), root, "nosuch.yaml: no such file")
    res = run_cli("search", "--margin", "1")  # without --recipe, click's own check as before
    assert res.exit_code == 2 and "Missing option '--base'" in res.output
