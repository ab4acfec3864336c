"""Protected steps end to end, against a dense float64 reference the test builds itself (its own hooks, its own SVD).

The reference loads the base with transformers, adds the backbone's dense update ``s B A`` (read from the PEFT
files without vecmerge) by its own forward hooks, captures each module's input rows item by item (no padding at
all), takes ``U`` from the SVD of the stacked rows, and forms ``D' = D - D U U^T`` densely.
"""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

import pytest
import torch

ENERGY = 0.9
TRUST = 0.05


def _prompts(path: Path, seed: int, items: int = 6, vocab: int = 96) -> Path:
    g = torch.Generator().manual_seed(seed)
    with open(path, "w") as f:
        for i in range(items):
            f.write(json.dumps({"id": i, "prompt_ids": torch.randint(0, vocab, (5,), generator=g).tolist(),
                                "target_ids": torch.randint(0, vocab, (3,), generator=g).tolist(),
                                "task": f"t{i % 2}"}) + "\n")
    return path


@pytest.fixture
def protect_ws(tmp_path, monkeypatch, tiny_base, peft_adapter):
    """A workspace with backbone a, direction b - c, protected sets keep1/keep2 and target goal."""
    names = {"a": peft_adapter("prot_a", seed=71), "b": peft_adapter("prot_b", seed=72),
             "c": peft_adapter("prot_c", seed=73)}
    monkeypatch.chdir(tmp_path)
    (tmp_path / "vecmerge.yaml").write_text("adapters:\n" + "".join(f"  {k}: {v}\n" for k, v in names.items())
                                            + f"base_model: {tiny_base}\n")
    for name, seed in (("keep1", 1), ("keep2", 2), ("goal", 3)):
        _prompts(tmp_path / f"{name}.jsonl", seed)
    return tmp_path, names


def _inputs(base: Path, backbone: dict, files: list[Path]) -> dict:
    """``{file: {module: X (rows, in) float64}}``: the test's own hooks, one item at a time, no padding."""
    from transformers import AutoModelForCausalLM

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).eval()
    rows: dict = {}
    handles = []
    for m, W in backbone.items():
        mod = model.get_submodule(m)
        handles.append(mod.register_forward_hook(
            lambda mod, args, out, m=m, W=W: (rows.setdefault(m, []).append(args[0][0].double()),
                                              out + args[0] @ W.float().T)[1]))
    out = {}
    with torch.no_grad():
        for f in files:
            rows.clear()
            for line in f.read_text().splitlines():
                it = json.loads(line)
                model(input_ids=torch.tensor([it["prompt_ids"] + it["target_ids"]]))
            out[f] = {m: torch.cat(v) for m, v in rows.items()}
    for h in handles:
        h.remove()
    return out


def _basis(X: torch.Tensor, energy: float) -> torch.Tensor:
    """The test's own U: right singular vectors of the stacked rows, the fewest holding ``energy`` of sum s^2."""
    _, S, Vh = torch.linalg.svd(X, full_matrices=False)
    e = S ** 2
    cum = torch.cumsum(e, 0) / e.sum()
    c = int((cum < energy - 1e-12).sum()) + 1
    return Vh[:c].T


def _fro2(d: dict) -> float:
    return sum(float((v ** 2).sum()) for v in d.values())


def test_protected_step_matches_a_dense_reference(protect_ws, run_cli, tiny_base, dense_updates):
    """The written update is backbone + alpha D' within 1e-6 of its norm; ranks and kept_* as the test computes."""
    root, names = protect_ws
    res = run_cli("project", "--base", "a", "--dir", "b - c", "--trust", TRUST, "--protect", "keep1=keep1.jsonl",
                  "--protect", "keep2=keep2.jsonl", "--target", "goal=goal.jsonl", "--out", "po", "--json")
    assert res.exit_code == 0, res.output
    rep = json.loads(res.output)
    prot = rep["outputs"][0]["protection"]
    A, B, Cc = (dense_updates(names[k]) for k in "abc")
    D = {m: B[m] - Cc[m] for m in A}
    X = _inputs(tiny_base, A, [root / "keep1.jsonl", root / "keep2.jsonl", root / "goal.jsonl"])
    x1, x2, xt = (X[root / f"{n}.jsonl"] for n in ("keep1", "keep2", "goal"))
    Dp, ranks = {}, {}
    for m in D:
        Xp = torch.cat([x1[m], x2[m]])
        U = _basis(Xp, ENERGY)
        Dp[m] = D[m] - (D[m] @ U) @ U.T
        ranks[m] = U.shape[1]
        assert ranks[m] <= int(torch.linalg.matrix_rank(Xp))
        assert float((Dp[m] @ U).norm()) <= 1e-10 * float(D[m].norm())
    alpha = TRUST * math.sqrt(_fro2(A)) / math.sqrt(_fro2(Dp))
    want = {m: A[m] + alpha * Dp[m] for m in A}
    got = dense_updates(root / "po")
    err = math.sqrt(sum(float(((got[m] - want[m]) ** 2).sum()) for m in want))
    assert err <= 1e-6 * math.sqrt(_fro2(want))
    assert rep["outputs"][0]["alpha"] == pytest.approx(alpha, rel=1e-6)
    assert prot["ranks"] == ranks

    def kept(Xs: dict) -> float:
        return math.sqrt(sum(float(((Dp[m] @ Xs[m].T) ** 2).sum()) for m in D)
                         / sum(float(((D[m] @ Xs[m].T) ** 2).sum()) for m in D))

    assert prot["protect"]["keep1"]["kept_drift"] == pytest.approx(kept(x1), rel=1e-5)
    assert prot["protect"]["keep2"]["kept_drift"] == pytest.approx(kept(x2), rel=1e-5)
    assert prot["target"]["goal"]["kept_change"] == pytest.approx(kept(xt), rel=1e-5)
    assert prot["kept_direction"] == pytest.approx(math.sqrt(_fro2(Dp) / _fro2(D)), rel=1e-6)
    assert prot["protect"]["keep1"]["positions"] == next(iter(x1.values())).shape[0] == 6 * 8
    manifest = json.loads((root / "po" / "vecmerge.json").read_text())
    assert manifest["protection"]["protect"]["keep1"]["sha256"] == prot["protect"]["keep1"]["sha256"]
    assert manifest["recipe"]["protect"] == {"keep1": "keep1.jsonl", "keep2": "keep2.jsonl"}
    # no absolute local path in the protection section either: the base model and prompt files relative to the ws
    assert manifest["protection"]["protect"]["keep1"]["path"] == "keep1.jsonl"
    assert manifest["protection"]["target"]["goal"]["path"] == "goal.jsonl"
    assert not Path(manifest["protection"]["base_model"]["path"]).is_absolute()
    assert (root / manifest["protection"]["base_model"]["path"]).resolve() == Path(tiny_base).resolve()


def test_an_energy_list_writes_one_output_per_energy(protect_ws, run_cli):
    """--protect-energy 0.5,0.99 writes OUT-e0.5 and OUT-e0.99, each with its own alpha and figures."""
    res = run_cli("project", "--base", "a", "--dir", "b - c", "--trust", TRUST, "--protect", "keep1=keep1.jsonl",
                  "--protect-energy", "0.5,0.99", "--out", "pe", "--json")
    assert res.exit_code == 0, res.output
    outs = json.loads(res.output)["outputs"]
    assert [o["path"] for o in outs] == ["pe-e0.5", "pe-e0.99"]
    assert [o["protection"]["energy"] for o in outs] == [0.5, 0.99]
    assert outs[1]["protection"]["protect"]["keep1"]["kept_drift"] < outs[0]["protection"]["protect"]["keep1"][
        "kept_drift"]
    for o in outs:
        assert json.loads((Path(o["path"]) / "vecmerge.json").read_text())["recipe"]["protect_energy"] == [
            o["protection"]["energy"]]


def _refused(res, *words) -> str:
    """The one error line of a refused run (exit 2), holding every one of ``words``."""
    lines = [ln for ln in res.output.splitlines() if ln.startswith("error:")]
    assert res.exit_code == 2 and len(lines) == 1, res.output
    for w in words:
        assert w in lines[0], lines[0]
    return lines[0]


def _write(path: Path, rows: list) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path.name


def test_bad_protection_input_is_one_line_exit_2_and_nothing_written(protect_ws, run_cli, tiny_base, tmp_path):
    """No base model, ids outside the vocabulary, an item over the context, an empty file, zero activations,
    E outside (0, 1], --protect without a step: each one line naming the file or key and the fix, exit 2."""
    root, _ = protect_ws
    step = ("project", "--base", "a", "--dir", "b - c", "--trust", TRUST, "--out", "po")
    big = _write(root / "big.jsonl", [{"id": 1, "prompt_ids": [5, 96], "target_ids": [1]}])
    long = _write(root / "long.jsonl", [{"id": 1, "prompt_ids": [5] * 70, "target_ids": [1]}])
    (root / "empty.jsonl").write_text("")
    cases = [(("--protect", "keep1=keep1.jsonl", "--protect-energy", "1.5"), ("protect-energy", "(0, 1]")),
             (("--protect", "keep1=keep1.jsonl", "--protect-energy", "0"), ("protect-energy",)),
             (("--protect", f"k={big}"), ("big.jsonl", "vocabulary of 96")),
             (("--protect", f"k={long}"), ("long.jsonl", "context of 64", "shorten")),
             (("--protect", "k=empty.jsonl"), ("empty.jsonl", "no items")),
             (("--protect", "keep1.jsonl"), ("--protect", "NAME=PROMPTS")),
             (("--target", "goal=goal.jsonl"), ("--target", "--protect")),
             (("--protect", "k=missing.jsonl"), ("missing.jsonl",)),
             (("--protect", "keep1=keep1.jsonl", "--protect-energy", "0.5,1.2"), ("protect-energy", "(0, 1]")),
             (("--protect", "keep1=keep1.jsonl", "--protect-energy", "-0.1"), ("protect-energy", "(0, 1]")),
             (("--protect-energy", "0.9"), ("protect-energy", "--protect")),
             (("--protect", "keep1=keep1.jsonl", "--target", f"t={big}"), ("big.jsonl", "vocabulary of 96")),
             (("--protect", "keep1=keep1.jsonl", "--target", "t=empty.jsonl"), ("empty.jsonl", "no items"))]
    for extra, words in cases:
        _refused(run_cli(*step, *extra), *words)
        assert not (root / "po").exists()
    # no base model: neither --base-model nor the workspace's base_model
    text = (root / "vecmerge.yaml").read_text()
    (root / "vecmerge.yaml").write_text("\n".join(ln for ln in text.splitlines() if not ln.startswith("base_model")))
    _refused(run_cli(*step, "--protect", "keep1=keep1.jsonl"), "--protect", "--base-model")
    # activations that are all zero: a base whose embeddings are zero reads zeros everywhere
    from transformers import AutoModelForCausalLM

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = AutoModelForCausalLM.from_pretrained(tiny_base)
        model.get_input_embeddings().weight.data.zero_()
        model.save_pretrained(tmp_path / "zero_base")
    _refused(run_cli(*step, "--protect", "keep1=keep1.jsonl", "--base-model", tmp_path / "zero_base"),
             "keep1.jsonl", "all zero")
    # a command without a step: a recipe with protect and no dir
    (root / "r.yaml").write_text("base: a\nprotect: {keep1: keep1.jsonl}\nout: po\n")
    _refused(run_cli("run", "r.yaml"), "protect", "dir")
    # a merge has no step: its command has no --protect, its recipe refuses the key
    _refused(run_cli("merge", "--protect", "keep1=keep1.jsonl", "a", "b", "--out", "po"), "--protect", "--help")
    (root / "m.yaml").write_text("method: ties\nmodels: [a, b]\nspace: core\nprotect: {keep1: keep1.jsonl}\nout: po\n")
    _refused(run_cli("run", "m.yaml"), "m.yaml", "protect", "vecmerge project")
    assert not (root / "po").exists()
