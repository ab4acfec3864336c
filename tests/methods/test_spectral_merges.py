"""The spectral family in factored form (TSV-M, Iso-C, Iso-CTS, KnOTS, SVC) against the dense definitions.

Inputs: the three PEFT folders of ``test_classic_merges`` (ranks 4, 4, 6; rsLoRA third) and larger modules
where ``min(out, in) / n`` caps TSV-M's triplets. References: numpy on the dense float64 updates read without
vecmerge (``merge_references``: the papers' definitions on the non-zero spectrum), PEFT's own TIES for KnOTS.
vecmerge forms no dense matrix for these (``Dense`` is made to fail here) and writes at most the summed
rank. Tolerance: relative Frobenius 1e-6 per module (lossless fp32 output: about 4e-8).
"""

from __future__ import annotations

import pytest
import torch
from merge_references import iso_c, iso_cts, knots, svc, tsv_m

from vecmerge.pipeline import run
from vecmerge.recipe.recipe import Recipe
from vecmerge.testing import toy_adapter
from vecmerge.verify.checks.output import verify_output
from vecmerge.workspace.names import Workspace

W3 = [0.5, -1.0, 2.0]


@pytest.fixture
def never_dense(monkeypatch):
    """Any dense (out, in) update made by a merge method fails the test."""
    from vecmerge.linalg.dense import Dense

    def refuse(self):
        raise AssertionError("a spectral merge formed a dense update")

    monkeypatch.setattr(Dense, "__post_init__", refuse)


def merge(out, **rec):
    return run(Recipe.from_dict({"out": out, **rec}), Workspace())


def models(names, weights=None):
    return [{"model": n, "weight": 1.0 if weights is None else weights[i]} for i, n in enumerate(names)]


def rel(x, ref):
    return float(torch.linalg.norm(x - ref) / torch.linalg.norm(ref))


def check(folder, want, dense_updates, rank_max=14, rtol=1e-6):
    got = dense_updates(folder)
    assert set(got) == set(want)
    for m in want:
        assert rel(got[m], want[m]) <= rtol, (m, rel(got[m], want[m]))
    assert verify_output(folder)["passed"]
    import json

    ranks = [e["rank"] for e in json.loads((folder / "vecmerge.json").read_text())["modules"].values()]
    assert max(ranks) <= rank_max


@pytest.mark.parametrize("extra,ref", [({}, {}), ({"sv_reduction": 0.15, "lambda": 1.5},
                                                  {"sv_reduction": 0.15, "lam": 1.5})])
def test_tsv_m(three, dense_updates, never_dense, extra, ref):
    D = {n: dense_updates(three / n) for n in "abc"}
    merge("tsv", method="tsv_m", models=models("abc"), **extra)
    check(three / "tsv", {m: tsv_m([D[n][m] for n in "abc"], **ref) for m in D["a"]}, dense_updates)


def test_tsv_m_caps_each_model_at_min_out_in_over_n(tmp_path, monkeypatch, dense_updates, never_dense):
    """A (24, 20) module with three rank-8 models: the paper's cap int(20 / 3) = 6 triplets of each is binding."""
    shapes = {"model.layers.0.mlp.up_proj": (24, 20), "model.layers.0.self_attn.q_proj": (20, 20)}
    for i, n in enumerate("xyz"):
        toy_adapter(tmp_path / n, shapes=shapes, rank=8, seed=40 + i)
    monkeypatch.chdir(tmp_path)
    D = {n: dense_updates(tmp_path / n) for n in "xyz"}
    merge("tsv", method="tsv_m", models=models("xyz"))
    check(tmp_path / "tsv", {m: tsv_m([D[n][m] for n in "xyz"]) for m in shapes}, dense_updates, rank_max=20)


@pytest.mark.parametrize("weights", [None, W3])
def test_iso_c_and_iso_cts(three, dense_updates, never_dense, weights):
    D = {n: dense_updates(three / n) for n in "abc"}
    w = weights or [1.0, 1.0, 1.0]
    Ds = {m: [wi * D[n][m] for wi, n in zip(w, "abc")] for m in D["a"]}
    merge("isoc", method="iso_c", models=models("abc", weights), **{"lambda": 1.3})
    check(three / "isoc", {m: iso_c(Ds[m], lam=1.3) for m in Ds}, dense_updates)
    for frac in (0.8, 0.5):
        merge(f"cts{frac}", method="iso_cts", models=models("abc", weights), common_space_fraction=frac)
        check(three / f"cts{frac}", {m: iso_cts(Ds[m], frac) for m in Ds}, dense_updates)


@pytest.mark.parametrize("how,extra", [("ties", {"density": 0.4}), ("dare_ties", {"density": 0.5, "seed": 3}),
                                       ("linear", {})])
def test_knots(three, dense_updates, peft_mu, never_dense, how, extra):
    D = {n: dense_updates(three / n) for n in "abc"}
    merge("kn", method="knots", models=models("abc", W3), knots_merge=how, **extra)
    want = {m: knots(peft_mu, [D[n][m] for n in "abc"], W3, extra.get("density"), how, extra.get("seed"), m)
            for m in D["a"]}
    check(three / "kn", want, dense_updates)
    if how == "linear":  # KnOTS' alignment is lossless: its linear merge is task arithmetic itself
        for m in D["a"]:
            assert rel(want[m], sum(w * D[n][m] for w, n in zip(W3, "abc"))) <= 1e-12


@pytest.mark.parametrize("alpha", [0.1, 1.0])
def test_svc(three, dense_updates, never_dense, alpha):
    D = {n: dense_updates(three / n) for n in "abc"}
    merge("svc", method="svc", models=models("abc", W3), svc_alpha=alpha, **{"lambda": 0.5})
    check(three / "svc", {m: svc([D[n][m] for n in "abc"], W3, alpha, 0.5) for m in D["a"]}, dense_updates)


def test_spectral_recipe_problems(three):
    from vecmerge.errors import RecipeError

    cases = {
        "method=knots with knots_merge ties: needs density": {"method": "knots", "models": ["a", "b"]},
        "method=iso_c: takes no density": {"method": "iso_c", "models": [{"model": "a", "density": 0.5}]},
        "common_space_fraction=1.5: between 0 and 1": {"method": "iso_cts", "models": ["a"],
                                                       "common_space_fraction": 1.5},
        "knots_merge='sum': one of ties, dare_ties, linear": {"method": "knots", "models": ["a"],
                                                             "knots_merge": "sum"},
    }
    for want, rec in cases.items():
        with pytest.raises(RecipeError) as e:
            Recipe.from_dict(rec)
        assert any(p.startswith(want) for p in e.value.problems), (want, e.value.problems)
