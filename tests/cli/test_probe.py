"""``vecmerge probe`` through the CLI: the JSON shape, the table, the ledger as cache, the plot, text prompts through
a tokenizer built here, and one-line errors."""

from __future__ import annotations

import json
import shutil
import warnings

import pytest
import torch

pytestmark = pytest.mark.slow
WORDS = ["[UNK]", "the", "cat", "sat", "on", "a", "mat", "dog", "ran"]


@pytest.fixture
def ws(tmp_path, monkeypatch, tiny_base, peft_adapter):
    for i, name in enumerate(("a", "b", "c")):
        shutil.copytree(peft_adapter(f"cli_probe{i}", seed=20 + i), tmp_path / name)
    (tmp_path / "vecmerge.yaml").write_text(f"base_model: {tiny_base}\nadapters:\n  a: a\n  b: b\n  c: c\n")
    g = torch.Generator().manual_seed(0)
    (tmp_path / "heldout.jsonl").write_text("".join(json.dumps({
        "id": f"s{i}", "prompt_ids": torch.randint(0, 96, (6,), generator=g).tolist(),
        "target_ids": torch.randint(0, 96, (4,), generator=g).tolist(), "task": "even" if i % 2 else "odd"}) + "\n"
        for i in range(8)))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def ok(res, code: int = 0):
    assert res.exit_code == code, res.output
    return res


def test_json_shape_table_cache_and_plot(ws, run_cli):
    out = json.loads(ok(run_cli("probe", "a", "b", "c", "--prompts", "heldout.jsonl", "--batch", "3", "--json")).output)
    assert set(out["models"]) == {"a", "b", "c"}
    item = out["models"]["a"]["items"]["s0"]
    assert set(item) == {"loglik", "tokens", "exact", "first_rank", "task", "cluster"} and item["tokens"] == 4
    assert {"loglik", "loglik_per_token", "exact", "first_rank", "top1", "tasks"} <= set(out["models"]["a"]["summary"])
    assert [(p["a"], p["b"]) for p in out["pairs"]] == [("a", "b"), ("a", "c"), ("b", "c")]
    assert all({"kl_ab", "kl_ba", "js"} <= set(p) and p["js"] > 0 for p in out["pairs"])
    assert out["prompts"]["path"] == "heldout.jsonl" and out["recorded"]["ledger"] == "vecmerge-evidence.db"
    text = ok(run_cli("probe", "a", "b", "c", "--prompts", "heldout.jsonl", "--plot", "map.png")).output
    assert "loglik/token" in text and "KL(row || column)" in text and "computed nothing" in text
    assert "recorded nothing new" in text and (ws / "map.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    shown = ok(run_cli("evidence", "show", "--metric", "probe:heldout:loglik")).output
    assert "item-level: a on probe:heldout:loglik: 8 items" in shown and "sub.even" in shown
    compared = ok(run_cli("evidence", "compare", "a", "b", "--metric", "probe:heldout:loglik")).output
    assert "paired" in compared and "8 items" in compared
    again = ok(run_cli("probe", "a", "--prompts", "heldout.jsonl", "--no-record", "--json")).output
    assert json.loads(again)["recorded"]["ledger"] is None
    assert json.loads(again)["models"]["a"]["items"] == out["models"]["a"]["items"]


def test_one_line_errors(ws, run_cli, tiny_base):
    (ws / "vecmerge.yaml").write_text("adapters:\n  a: a\n")
    res = ok(run_cli("probe", "a", "--prompts", "heldout.jsonl"), 2)
    assert res.output.strip() == "error: probe: give --base-model DIR (or base_model: in vecmerge.yaml)"
    res = ok(run_cli("probe", "a", "--prompts", "heldout.jsonl", "--base-model", "a"), 2)
    assert "is a LoRA adapter folder" in res.output and len(res.output.strip().splitlines()) == 1
    (ws / "text.jsonl").write_text(json.dumps({"id": 1, "prompt": "the cat", "target": "sat"}) + "\n")
    res = ok(run_cli("probe", "a", "--prompts", "text.jsonl", "--base-model", tiny_base), 2)
    assert "line 1: text (prompt or target), and the base model folder has no tokenizer" in res.output
    assert len(res.output.strip().splitlines()) == 1
    res = ok(run_cli("probe", "a", "a", "--prompts", "heldout.jsonl", "--base-model", tiny_base), 2)
    assert "name each adapter once" in res.output


def test_text_prompts_through_a_tokenizer_built_here(ws, run_cli, tiny_base):
    from peft import PeftModel
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    base = ws / "base"
    shutil.copytree(tiny_base, base)
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]").save_pretrained(base)
    rows = [("t1", "the cat sat on", " a mat"), ("t2", "a dog ", "ran on the mat"), ("t3", "the", " dog sat")]
    (ws / "words.jsonl").write_text("".join(json.dumps({"id": i, "prompt": p, "target": t}) + "\n"
                                            for i, p, t in rows))
    out = json.loads(ok(run_cli("probe", "a", "--prompts", "words.jsonl", "--base-model", base, "--json")).output)
    assert out["prompts"]["tokenized"] is True
    ids = {w: i for i, w in enumerate(WORDS)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), str(ws / "a")).eval()
    for item, prompt, target in rows:
        p, t = [ids[w] for w in prompt.split()], [ids[w] for w in target.split()]
        with torch.no_grad():
            lp = torch.log_softmax(model(input_ids=torch.tensor([p + t])).logits[0].double(), -1)
        want = sum(float(lp[len(p) - 1 + k, y]) for k, y in enumerate(t))
        got = out["models"]["a"]["items"][item]
        assert got["tokens"] == len(t) and got["loglik"] == pytest.approx(want, rel=1e-5)
