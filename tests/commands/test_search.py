"""``vecmerge search``'s bad input (issue 35, item 7): one line, exit 2, nothing written (no output, no ledger)."""

from __future__ import annotations

import hashlib
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


def test_ctrl_c_while_writing_leaves_no_record_and_resume_replaces_what_was_written(ws, run_cli, monkeypatch):
    """Issue: Ctrl-C while the outputs were written left search.json without front.png or the top folders. The
    record is written last; the same command with --resume replaces the interrupted run's outputs."""
    from vecmerge.report import search as report_search

    root, base = ws
    real = report_search.plot_front

    def interrupted(d, f):
        raise KeyboardInterrupt

    monkeypatch.setattr(report_search, "plot_front", interrupted)
    res = _search(run_cli, base, "--top", "1", margin="1000", budget="3")
    assert res.exit_code == 130 and "interrupted" in res.output, res.output
    assert (root / "out" / "top1" / "vecmerge.json").is_file()  # the top K came first ...
    assert not (root / "out" / "search.json").exists() and not (root / "out" / "front.png").exists()  # ... not it
    monkeypatch.setattr(report_search, "plot_front", real)
    again = _search(run_cli, base, "--top", "1", "--json", margin="1000", budget="3")
    assert again.exit_code == 2 and "top1" in again.output  # without --resume, the folder is not replaced
    again = _search(run_cli, base, "--top", "1", "--json", "--resume", margin="1000", budget="3")
    assert again.exit_code == 0, again.output
    d = json.loads(again.stdout)
    assert d["computed"] == 0 and (root / "out" / "front.png").is_file()
    record = (root / "out" / "search.json").read_bytes()
    manifest = json.loads((root / "out" / "top1" / "vecmerge.json").read_text())
    assert manifest["config"]["sha256"] == hashlib.sha256(record).hexdigest()


@pytest.mark.parametrize("out", ["ro", "ro/sub"])
def test_an_unwritable_out_dir_is_refused_before_any_computation(ws, run_cli, monkeypatch, out):
    """Issue: a read-only --out-dir was found only after the whole search (``ro/sub``: a raw PermissionError)."""
    import os

    root, base = ws
    (root / "ro").mkdir()
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: real(p, mode, **kw) and not (str(p).endswith("ro")
                                                                            and mode & os.W_OK))  # root: a ro mount
    res = run_cli("search", "--base", "a", "--dir", "b - a", "--target", "t=t.jsonl", "--protect", "p=p.jsonl",
                  "--margin", "1000", "--trust-max", "0.1", "--budget", "2", "--sampler", "grid",
                  "--base-model", base, "--out-dir", out)
    assert res.exit_code == 2, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and "--out-dir" in lines[0] and "not writable" in lines[0], res.output
    assert not (root / "vecmerge-evidence.db").exists() and os.listdir(root / "ro") == []


def test_a_zero_direction_is_refused_before_the_capture(ws, run_cli):
    """Issue: ``--dir 'bb - bb'`` was caught after the capture (the ledger written, the message naming a
    candidate): now one line naming the --dir, exit 2, no ledger."""
    root, base = ws
    _refused(_search(run_cli, base, direction="b - b"), root, "--dir b - b", "zero")


def test_a_set_name_reused_with_another_file_names_the_search_flag(ws, run_cli):
    """Issue: reusing a set name with another file gave probe's message (``--prompts X ... pass --name NAME``)."""
    root, base = ws
    first = _search(run_cli, base, "--top", "1", margin="1000", budget="1")
    assert first.exit_code == 0, first.output
    _prompts(root / "q.jsonl", [{"id": i, "prompt_ids": [5, i + 20], "target_ids": [42]} for i in range(6)])
    res = _search(run_cli, base, "--top", "1", "--out-dir", "out2", protect="p=q.jsonl", margin="1000", budget="1")
    assert res.exit_code == 2, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --protect p=q.jsonl:"), res.output
    assert "another NAME" in lines[0] and "--prompts" not in lines[0] and "--name" not in lines[0]
    assert not (root / "out2").exists()


def test_workers_without_ray_is_one_line_before_any_computation(ws, run_cli, monkeypatch):
    import builtins

    root, base = ws
    real = builtins.__import__

    def no_ray(name, *a, **k):
        if name == "ray" or name.startswith("ray."):
            raise ImportError(name)
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_ray)
    _refused(_search(run_cli, base, "--workers", "1"), root, "--workers", "vecmerge[ray]")


def test_workers_score_through_a_pool_that_is_closed_after(ws, run_cli, monkeypatch):
    """``--workers 2``: the pool is built from the search's setup with 2 workers, every computed candidate is
    scored through it (a stand-in scoring in this process, as ``fanout.Worker`` does), and it is closed."""
    from vecmerge.search import fanout
    from vecmerge.search.candidate import build
    from vecmerge.search.space import candidate

    root, base = ws
    made, closed, scored = [], [], []

    class Pool:
        def __init__(self, setup, *, workers=None, gpus=True):
            self.setup = setup
            made.append(workers)

        def __len__(self):
            return 2

        def score(self, jobs):
            for params, names in jobs:
                c = candidate(self.setup.space, params)
                b = build(c, self.setup.factors)
                scored.append(c.sha256)
                yield c.sha256, self.setup.scorer.scores(b.updates, names), fanout.Step(b.alpha, b.step,
                                                                                       b.kept_direction)

        def forwards(self):
            return 0

        def close(self):
            closed.append(True)

    monkeypatch.setattr(fanout, "ray_module", lambda: None)
    monkeypatch.setattr(fanout, "Pool", Pool)
    res = _search(run_cli, base, "--workers", "2", "--top", "1", "--json", margin="1000", budget="3")
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    assert made == [2] and closed == [True]
    assert scored == [c["sha256"] for c in d["candidates"] if c["computed"]] and d["computed"] == len(scored) > 0


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
