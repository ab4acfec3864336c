"""probe/capture.py: Grams of module inputs by hooks, shared where modules read one input, padding left out."""

from __future__ import annotations

import warnings

import torch

from vecmerge.probe.capture import capture_grams
from vecmerge.probe.prompts import Item, PromptSet


def _set(lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    items = tuple(Item(str(i), tuple(torch.randint(0, 96, (n - 1,), generator=g).tolist()),
                       (int(torch.randint(0, 96, (1,), generator=g)),), line=i + 1) for i, n in enumerate(lengths))
    return PromptSet(None, "0" * 64, items, "s")


def test_grams_equal_the_inputs_read_one_item_at_a_time_and_q_k_v_share_one(tiny_base):
    """Batched and right-padded, the Grams equal X^T X of each item's own unpadded forward; q/k/v share a tensor."""
    from transformers import AutoModelForCausalLM

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = AutoModelForCausalLM.from_pretrained(tiny_base, dtype=torch.float32).eval()
    mods = [f"model.layers.0.self_attn.{p}_proj" for p in "qkvo"] + ["model.layers.1.mlp.down_proj"]
    ps = _set([7, 3, 5, 9, 4])
    got = capture_grams(model, {}, {"s": ps}, mods, batch=2)
    old = capture_grams(model, {}, {"s": ps}, mods, batch=2, row_limit=0)  # a float64 Gram from the first batch
    seen: dict = {}
    hs = [model.get_submodule(m).register_forward_hook(
        lambda mod, a, o, m=m: seen.setdefault(m, []).append(a[0][0].double())) for m in mods]
    with torch.no_grad():
        for it in ps.items:
            model(input_ids=torch.tensor([it.prompt_ids + it.target_ids]))
    for h in hs:
        h.remove()
    for m in mods:
        X = torch.cat(seen[m])
        want = X.T @ X
        for held in (got, old):
            assert float((held.by_set["s"][m].gram() - want).norm()) <= 1e-5 * float(want.norm())
        assert got.by_set["s"][m].kind == "rows" and old.by_set["s"][m].kind == "gram"  # 28 rows < width 32
    g = got.by_set["s"]
    q, k, v, o = (g[f"model.layers.0.self_attn.{p}_proj"] for p in "qkvo")
    assert q is k is v and o is not q
    assert got.rows["s"] == 28


def test_u_from_the_kept_rows_equals_u_from_the_gram(tiny_base):
    """Grams.basis from the rows' SVD (two sets stacked) and from the float64 Grams' eigh give one projector U U^T
    (1e-8) and one rank, at every energy; q/k/v share one decomposition."""
    from transformers import AutoModelForCausalLM

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = AutoModelForCausalLM.from_pretrained(tiny_base, dtype=torch.float32).eval()
    mods = [f"model.layers.0.self_attn.{p}_proj" for p in "qkvo"] + ["model.layers.1.mlp.down_proj"]
    sets = {"a": _set([7, 3, 5]), "b": _set([6, 4], seed=1)}
    rows = capture_grams(model, {}, sets, mods, batch=2)
    grams = capture_grams(model, {}, sets, mods, batch=2, row_limit=0)
    for m in mods:
        assert rows.by_set["a"][m].kind == "rows" and grams.by_set["a"][m].kind == "gram"
        for E in (0.5, 0.9, 0.99, 1.0):
            U1, U2 = rows.basis(["a", "b"], m, E), grams.basis(["a", "b"], m, E)
            assert U1.shape == U2.shape and U1.shape[1] <= 25  # at most the 25 rows read
            assert float((U1 @ U1.T - U2 @ U2.T).norm()) <= 1e-8 * max(1.0, U1.shape[1])
    assert len(rows._decomp) == 3  # q/k/v's input, o's, down's
