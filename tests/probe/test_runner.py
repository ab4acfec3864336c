"""``run_probe`` against transformers + PEFT computed here, item by item, and its use of the ledger as a cache.

The reference loads each adapter with ``PeftModel.from_pretrained`` on a fresh base and runs every item alone
(no batching, no padding): loglik = the sum of float64 log_softmax at the target positions (rel 1e-5), exact =
``generate`` greedy reproduces the target, first_rank = 1 + the tokens with a larger first logit, KL/JS from the
two PEFT models' distributions written out below.
"""

from __future__ import annotations

import json
import math
import warnings

import pytest
import torch

from vecmerge.errors import UsageError
from vecmerge.evidence.ledger import pairs as pair_records
from vecmerge.evidence.ledger.ledger import Ledger
from vecmerge.peft.adapter import Adapter
from vecmerge.probe import records
from vecmerge.probe.prompts import read_prompts
from vecmerge.probe.runner import ProbeModel, run_probe

pytestmark = pytest.mark.slow
VOCAB = 96  # conftest's TINY_DECODER


def write_prompts(path, n=9, seed=1, tasks=("a", "b"), clusters=3):
    g = torch.Generator().manual_seed(seed)
    with open(path, "w") as f:
        for i in range(n):
            p, t = int(torch.randint(1, 9, (1,), generator=g)), int(torch.randint(1, 6, (1,), generator=g))
            f.write(json.dumps({"id": f"q{i}", "prompt_ids": torch.randint(0, VOCAB, (p,), generator=g).tolist(),
                                "target_ids": torch.randint(0, VOCAB, (t,), generator=g).tolist(),
                                "task": tasks[i % len(tasks)], "cluster": f"c{i % clusters}"}) + "\n")
    return path


def models_of(*folders):
    return [ProbeModel(f.name, Adapter(f), Adapter(f).content_sha256) for f in folders]


def peft_model(base, folder):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), str(folder)).eval()


def reference(model, item):
    """(loglik, exact, first_rank, log-probs (T, V) float64) of one item, computed alone by PEFT's model."""
    ids = torch.tensor([list(item.prompt_ids + item.target_ids)])
    p, t = len(item.prompt_ids), len(item.target_ids)
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, p - 1:p + t - 1]
        greedy = model.generate(input_ids=ids[:, :p], attention_mask=torch.ones_like(ids[:, :p]), do_sample=False,
                                max_new_tokens=t, min_new_tokens=t, pad_token_id=0)[0, p:]
    lp = torch.log_softmax(logits.double(), -1)
    loglik = sum(float(lp[k, y]) for k, y in enumerate(item.target_ids))
    first = logits[0]
    rank = 1 + int((first > first[item.target_ids[0]]).sum())
    return loglik, int(greedy.tolist() == list(item.target_ids)), rank, lp


@pytest.fixture(scope="module")
def setup(tiny_base, peft_adapter, tmp_path_factory):
    root = tmp_path_factory.mktemp("probe")
    prompts = read_prompts(write_prompts(root / "toy.jsonl"))
    folders = [peft_adapter(f"probe{i}", seed=10 + i) for i in range(3)]
    return root, prompts, folders


def test_scores_equal_peft_item_by_item(setup, tiny_base):
    root, prompts, folders = setup
    result = run_probe(tiny_base, models_of(*folders), prompts, batch=4)
    lps = {}
    for folder in folders[:2]:
        model = peft_model(tiny_base, folder)
        mine = result.models[folder.name]["items"]
        for item in prompts.items:
            loglik, exact, rank, lp = reference(model, item)
            lps[(folder.name, item.id)] = lp
            got = mine[item.id]
            assert got["loglik"] == pytest.approx(loglik, rel=1e-5)
            assert (got["exact"], got["first_rank"], got["tokens"]) == (exact, rank, len(item.target_ids))
    a, b = folders[0].name, folders[1].name
    row = next(r for r in result.pairs if (r["a"], r["b"]) == (a, b))
    kl_ab, kl_ba, js = [], [], []
    for item in prompts.items:  # the formulas of scores.py, written out over the PEFT distributions
        la, lb = lps[(a, item.id)], lps[(b, item.id)]
        pa, pb = la.exp(), lb.exp()
        m = (pa + pb) / 2
        kl_ab.append(float((pa * (la - lb)).sum(-1).mean()))
        kl_ba.append(float((pb * (lb - la)).sum(-1).mean()))
        js.append(float((0.5 * (pa * (la - m.log())).sum(-1) + 0.5 * (pb * (lb - m.log())).sum(-1)).mean()))
    n = len(prompts.items)
    assert (row["kl_ab"], row["kl_ba"], row["js"]) == pytest.approx((sum(kl_ab) / n, sum(kl_ba) / n, sum(js) / n),
                                                                     rel=1e-5)
    s = result.models[a]["summary"]
    items = result.models[a]["items"].values()
    assert s["loglik_per_token"] == pytest.approx(sum(i["loglik"] for i in items) / sum(i["tokens"] for i in items),
                                                  rel=1e-12)
    assert set(s["tasks"]) == {"a", "b"}


def test_batch_size_does_not_change_the_scores(setup, tiny_base):
    root, prompts, folders = setup
    one = run_probe(tiny_base, models_of(*folders[:2]), prompts, batch=1)
    many = run_probe(tiny_base, models_of(*folders[:2]), prompts, batch=16)
    for name in one.models:
        for i, s in one.models[name]["items"].items():
            assert many.models[name]["items"][i]["loglik"] == pytest.approx(s["loglik"], rel=1e-5)
    assert many.pairs[0]["js"] == pytest.approx(one.pairs[0]["js"], rel=1e-5)


def test_the_ledger_is_the_cache(setup, tiny_base, tmp_path):
    root, prompts, folders = setup
    ledger = Ledger(tmp_path / "ledger.db")
    first = run_probe(tiny_base, models_of(*folders[:2]), prompts, ledger=ledger, batch=4)
    n = len(prompts.items)
    assert first.computed["forwards"] == {folders[0].name: n, folders[1].name: n}
    assert first.recorded["records"] == 2 * (3 * n + 4) and first.recorded["pair_records"] == 3 * n
    before = ledger.export()
    again = run_probe(tiny_base, models_of(*folders[:2]), prompts, ledger=ledger, batch=4)
    assert again.computed == {"forwards": {folders[0].name: 0, folders[1].name: 0}, "batches": 0}
    assert again.recorded["records"] == 0 and again.recorded["pair_records"] == 0 and ledger.export() == before
    assert again.models == first.models and again.pairs == first.pairs
    # a third adapter: its own items, and the pairs with it (which need the other two's distributions again)
    third = run_probe(tiny_base, models_of(*folders), prompts, ledger=ledger, batch=4)
    assert third.computed["forwards"] == {f.name: n for f in folders}
    assert third.recorded["records"] == 3 * n + 4 and third.recorded["pair_records"] == 2 * 3 * n
    assert {k: third.models[k] for k in first.models} == first.models
    # without pairs, a fourth adapter alone runs
    more = [ProbeModel("p3", Adapter(folders[0]), "f" * 64)]  # other weights as far as the ledger knows
    alone = run_probe(tiny_base, models_of(*folders) + more, prompts, ledger=ledger, pairs=False)
    assert alone.computed["forwards"] == {**{f.name: 0 for f in folders}, "p3": n} and alone.pairs == []
    runs = ledger.records(metric="probe:toy:loglik", level="run")
    assert len(runs) == 4 and {r.model for r in runs} == {*(f.name for f in folders), "p3"}
    mine = next(r for r in runs if r.model == folders[0].name)
    assert mine.value == pytest.approx(first.models[folders[0].name]["summary"]["loglik"], rel=1e-12)
    assert set(mine.sub_scores) == {"a", "b"} and mine.source == f"probe:toy.jsonl@{prompts.sha256}"
    items = ledger.records([folders[0].name], "probe:toy:loglik", level="item")
    assert {r.cluster for r in items} == {"c0", "c1", "c2"}
    assert ledger.directions()["probe:toy:first_rank"] is False and ledger.directions()["probe:toy:loglik"]


def test_an_interrupted_probe_computes_only_what_is_missing(setup, tiny_base, tmp_path, monkeypatch):
    root, prompts, folders = setup
    ledger = Ledger(tmp_path / "ledger.db")
    real, calls = records.write, []

    def fail_second(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(records, "write", fail_second)
    with pytest.raises(KeyboardInterrupt):
        run_probe(tiny_base, models_of(*folders[:2]), prompts, ledger=ledger, batch=4)
    monkeypatch.setattr(records, "write", real)
    done = {r.item for r in ledger.records(metric="probe:toy:loglik", level="item")}
    assert len(done) == 4  # the first batch, recorded whole
    rest = run_probe(tiny_base, models_of(*folders[:2]), prompts, ledger=ledger, batch=4)
    assert rest.computed["forwards"] == {f.name: len(prompts.items) - 4 for f in folders[:2]}
    full = run_probe(tiny_base, models_of(*folders[:2]), prompts, batch=4)
    for name in full.models:
        for i, s in full.models[name]["items"].items():
            assert rest.models[name]["items"][i]["loglik"] == pytest.approx(s["loglik"], rel=1e-5)
    assert rest.pairs[0]["js"] == pytest.approx(full.pairs[0]["js"], rel=1e-5)
    assert len(pair_records.records(ledger, ["probe:toy:kl"])) == 2 * len(prompts.items)


def test_other_prompt_bytes_under_the_same_name_are_refused(setup, tiny_base, tmp_path):
    root, prompts, folders = setup
    ledger = Ledger(tmp_path / "ledger.db")
    run_probe(tiny_base, models_of(folders[0]), prompts, ledger=ledger)
    other = read_prompts(write_prompts(tmp_path / "toy.jsonl", seed=5))
    with pytest.raises(UsageError, match="another prompt file .* rename the file or pass --name"):
        run_probe(tiny_base, models_of(folders[0]), other, ledger=ledger)
    renamed = read_prompts(tmp_path / "toy.jsonl", stem="toy2")
    assert run_probe(tiny_base, models_of(folders[0]), renamed, ledger=ledger).recorded["records"] > 0


def test_new_weights_under_an_old_name_are_probed_again(setup, tiny_base, tmp_path):
    root, prompts, folders = setup
    ledger = Ledger(tmp_path / "ledger.db")
    a = Adapter(folders[0])
    run_probe(tiny_base, [ProbeModel("m", a, a.content_sha256)], prompts, ledger=ledger)
    b = Adapter(folders[1])
    again = run_probe(tiny_base, [ProbeModel("m", b, b.content_sha256)], prompts, ledger=ledger)
    assert again.computed["forwards"] == {"m": len(prompts.items)}
    current = ledger.records(["m"], "probe:toy:loglik", current_sha={"m": b.content_sha256}, level="item")
    assert len(current) == len(prompts.items) and all(r.sha256 == b.content_sha256 for r in current)


def test_token_ids_outside_the_vocabulary_are_refused(setup, tiny_base, tmp_path):
    root, prompts, folders = setup
    (tmp_path / "big.jsonl").write_text(json.dumps({"id": 1, "prompt_ids": [1, VOCAB], "target_ids": [2]}) + "\n")
    from vecmerge.io.parse import ParseError

    with pytest.raises(ParseError, match=rf"vocabulary of {VOCAB} \(line 1 \(1\): token {VOCAB}\); use ids below"):
        run_probe(tiny_base, models_of(folders[0]), read_prompts(tmp_path / "big.jsonl"))


def test_map_and_summaries_are_consistent(setup, tiny_base):
    root, prompts, folders = setup
    r = run_probe(tiny_base, models_of(*folders), prompts)
    L = [[r.models[f.name]["items"][i]["loglik"] for i in prompts.ids] for f in folders]
    a, b = folders[0].name, folders[2].name
    rms = math.sqrt(sum((x - y) ** 2 for x, y in zip(L[0], L[2])) / len(prompts.ids))
    assert r.map["distance"][a][b] == pytest.approx(rms, rel=1e-12)
    (xa, ya), (xb, yb) = r.map["coords"][a], r.map["coords"][b]
    # three points lie in a plane: the 2-D map keeps their distance exactly
    assert math.hypot(xa - xb, ya - yb) == pytest.approx(rms * math.sqrt(len(prompts.ids)), rel=1e-9)
    assert len(r.map["informative"]) == min(10, len(prompts.ids))


def test_gpt2_conv1d_and_embedding_adapters_equal_peft(hf_base, tmp_path):
    """Conv1D (fan_in_fan_out) and embedding LoRA through the whole probe: logliks against PEFT, item by item."""
    from conftest import save_peft

    base = hf_base("gpt2")  # vocab 64
    folder = save_peft(base, tmp_path / "g", seed=4, target_modules=["wte", "c_attn", "c_proj"], fan_in_fan_out=True)
    g = torch.Generator().manual_seed(2)
    (tmp_path / "g.jsonl").write_text("".join(json.dumps({
        "id": i, "prompt_ids": torch.randint(0, 64, (5 + i,), generator=g).tolist(),
        "target_ids": torch.randint(0, 64, (3,), generator=g).tolist()}) + "\n" for i in range(4)))
    prompts = read_prompts(tmp_path / "g.jsonl")
    result = run_probe(base, models_of(folder), prompts, batch=3)
    model = peft_model(base, folder)
    for item in prompts.items:
        loglik, exact, rank, _ = reference(model, item)
        got = result.models["g"]["items"][item.id]
        assert got["loglik"] == pytest.approx(loglik, rel=1e-5) and (got["exact"], got["first_rank"]) == (exact, rank)


@pytest.mark.parametrize("kind, context, key", [("llama", 64, "max_position_embeddings"), ("gpt2", 32, "n_positions")])
def test_prompts_longer_than_the_models_context_are_refused(hf_base, tmp_path, monkeypatch, run_cli, kind, context,
                                                            key):
    """Issue 36 item 6: an item of context + 1 tokens was scored silently on Llama (positions past its 64) and an
    IndexError (exit 3) on GPT-2. Now exit 2, one line naming the file, the item, its length and the context read
    from the config; nothing recorded. An item of exactly ``context`` tokens is scored."""
    from conftest import save_peft
    from transformers import AutoConfig

    base = hf_base(kind)
    assert getattr(AutoConfig.from_pretrained(base), key) == context  # the independent reading of the limit
    targets = ["c_attn"] if kind == "gpt2" else ["q_proj"]
    save_peft(base, tmp_path / "a", seed=3, target_modules=targets, fan_in_fan_out=kind == "gpt2")
    (tmp_path / "vecmerge.yaml").write_text(f"adapters:\n  a: {tmp_path / 'a'}\nbase_model: {base}\n")
    rows = [{"id": "fits", "prompt_ids": [1] * (context - 2), "target_ids": [2, 3]},
            {"id": "long", "prompt_ids": [1] * (context - 1), "target_ids": [2, 3]}]
    (tmp_path / "p.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    monkeypatch.chdir(tmp_path)
    res = run_cli("probe", "a", "--prompts", "p.jsonl")
    assert res.exit_code == 2, res.output
    line = res.output.strip()
    assert "\n" not in line and "p.jsonl" in line and "long" in line and f"{context + 1} tokens" in line
    assert f"context of {context} positions" in line and "fits" not in line
    db = tmp_path / "vecmerge-evidence.db"
    if db.exists():  # the ledger may be opened; it holds no record
        import sqlite3

        with sqlite3.connect(db) as con:
            assert "records" not in {r[0] for r in con.execute("SELECT name FROM sqlite_master")} or \
                con.execute("SELECT COUNT(*) FROM records").fetchone()[0] == 0
    (tmp_path / "p.jsonl").write_text(json.dumps(rows[0]) + "\n")
    res = run_cli("probe", "a", "--prompts", "p.jsonl", "--no-record", "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["models"]["a"]["items"]["fits"]["tokens"] == 2


def test_probe_summarises_each_task_and_its_change_from_the_first_model(setup, tiny_base):
    """Per task: each model's loglik, and each later model's paired change from the first, from PEFT's own scores."""
    from vecmerge.report.probe import render_probe

    _, prompts, folders = setup
    result = run_probe(tiny_base, models_of(*folders[:2]), prompts, batch=4, pairs=False)
    a, b = (peft_model(tiny_base, f) for f in folders[:2])
    diffs: dict = {}
    for it in prompts.items:
        diffs.setdefault(it.task, []).append(reference(b, it)[0] - reference(a, it)[0])
    got = result.models[folders[1].name]["summary"]["changes"]
    assert got["from"] == folders[0].name
    for t, ds in diffs.items():
        assert got["tasks"][t]["change"] == pytest.approx(sum(ds) / len(ds), rel=1e-5, abs=1e-6)
        assert got["tasks"][t]["items"] == len(ds)
    assert "changes" not in result.models[folders[0].name]["summary"]
    assert "change of loglik/item from" in render_probe(result.to_dict())
