"""``vecmerge merge`` against PEFT 0.21's ``add_weighted_adapter`` on the same adapters (tiny random Qwen3).

What agrees, at full rank (PEFT's ``svd_rank`` = 32 = min(out, in) of the targeted modules, q/o/gate/up/
down): ``svd``, ``ties_svd``, ``magnitude_prune_svd``, ``dare_linear_svd``, ``dare_ties_svd`` and ``cat``
give the same per-module update as ours within rtol 1e-5 (relative Frobenius; PEFT forms the dense
deltas, merges and SVDs them in float32, about 1e-6 of the update). DARE agrees exactly, not just in
distribution: PEFT draws its masks from the global generator, and seeding it per module with our
``module_seed(seed, module)`` (a wrapper around PEFT's per-module merge) reproduces our masks bit for bit.

Where PEFT differs, ours equals the dense definition (rtol 1e-6) and PEFT's does not: the merge of an
rsLoRA adapter listed first comes out ``sqrt(new_rank)`` times too large (``cat`` and ``svd``), and the
factor-wise ``linear`` and ``ties`` are not the method applied to the update (relative error above 0.3).
Every method's output loads in PEFT, whose ``get_delta_weight`` equals the intended update (rtol 1e-5),
and ``vecmerge verify --base-model`` passes on it.
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from vecmerge.linalg.merge_kernels import module_seed
from vecmerge.pipeline import run
from vecmerge.recipe.recipe import Recipe
from vecmerge.verify.checks.output import verify_output
from vecmerge.workspace.names import Workspace

pytestmark = pytest.mark.slow
FULL = ["q_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]  # min(out, in) = 32 in every one
W2 = [1.5, -0.5]  # dyadic: PEFT turns weights into float32


def rel(x, ref) -> float:
    return float(torch.linalg.norm(x.double() - ref.double()) / torch.linalg.norm(ref.double()))


def peft_model(tiny_base, adapters: dict):
    """A PeftModel of ``tiny_base`` with ``adapters`` ({name: folder}) loaded, in float32."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_base)
    pm = None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, path in adapters.items():
            if pm is None:
                pm = PeftModel.from_pretrained(model, str(path), adapter_name=name)
            else:
                pm.load_adapter(str(path), adapter_name=name)
    return pm


def peft_merge(pm, names, weights, new, **kw) -> dict:
    """``add_weighted_adapter`` then ``{module: get_delta_weight(new)}`` (float64, (out, in))."""
    from peft.tuners.lora import LoraLayer

    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pm.add_weighted_adapter(list(names), list(weights), new, **kw)
        return {n.removeprefix("base_model.model."): mod.get_delta_weight(new).double()
                for n, mod in pm.named_modules() if isinstance(mod, LoraLayer) and new in mod.lora_A}


@pytest.fixture
def ours(tmp_path, dense_updates):
    """``ours(adapters, out, **recipe)``: our merge of ``adapters`` (pinned by path) at ``tmp_path/out``, read back
    densely without vecmerge."""
    def merge(adapters: dict, out: str, **rec) -> dict:
        inputs = {n: str(p) for n, p in adapters.items()}
        run(Recipe.from_dict({"inputs": inputs, "out": str(tmp_path / out), **rec}), Workspace(root=tmp_path))
        return dense_updates(tmp_path / out)

    return merge


@pytest.fixture(scope="module")
def pair(peft_adapter):
    return {"a": peft_adapter("par_a", seed=11, target_modules=FULL),
            "b": peft_adapter("par_b", seed=12, target_modules=FULL, lora_alpha=4)}


@pytest.fixture
def seeded_peft(monkeypatch):
    """Seed PEFT's global generator per module with ``module_seed(seed, module)`` before its dense merge."""
    from peft.tuners.lora import LoraLayer
    from peft.tuners.lora.model import LoraModel

    orig = LoraModel._svd_generalized_task_arithmetic_weighted_adapter

    def install(pm, seed: int):
        names = {id(mod): n.removeprefix("base_model.model.") for n, mod in pm.named_modules()
                 if isinstance(mod, LoraLayer)}

        def seeded(self, combination_type, adapters, weights, new_rank, target, *args, **kwargs):
            torch.manual_seed(module_seed(seed, names[id(target)]))
            return orig(self, combination_type, adapters, weights, new_rank, target, *args, **kwargs)

        monkeypatch.setattr(LoraModel, "_svd_generalized_task_arithmetic_weighted_adapter", seeded)

    return install


@pytest.mark.parametrize("kind,method,extra", [
    ("svd", "linear", {}),
    ("ties_svd", "ties", {"density": 0.5}),
    ("magnitude_prune_svd", "magnitude_prune", {"density": 0.4}),
    ("dare_linear_svd", "dare_linear", {"density": 0.5, "seed": 5}),
    ("dare_ties_svd", "dare_ties", {"density": 0.6, "seed": 5}),
    ("cat", "cat", {}),
])
def test_same_update_as_peft_at_full_rank(ours, tiny_base, pair, seeded_peft, kind, method, extra):
    pm = peft_model(tiny_base, pair)
    seeded_peft(pm, extra.get("seed", 0))
    kw = {"combination_type": kind}
    if kind != "cat":
        kw["svd_rank"] = 32
    if "density" in extra:
        kw["density"] = extra["density"]
    theirs = peft_merge(pm, ["a", "b"], W2, "m", **kw)
    rank = {} if method in ("linear", "cat") else {"rank": "exact"}
    mine = ours(pair, method, method=method, models=[{"model": "a", "weight": W2[0]},
                                                                {"model": "b", "weight": W2[1]}], **extra, **rank)
    assert set(mine) == set(theirs) and len(mine) == 10
    for m in mine:
        assert rel(mine[m], theirs[m]) <= 1e-5, (m, rel(mine[m], theirs[m]))


def test_rslora_first_peft_is_off_by_sqrt_of_the_new_rank_ours_is_not(ours, tiny_base, peft_adapter,
                                                                      dense_updates):
    adapters = {"rs": peft_adapter("par_rs", seed=21, r=8, lora_alpha=8, use_rslora=True),
                "cl": peft_adapter("par_cl", seed=22, r=4, lora_alpha=8)}
    want = {m: dense_updates(adapters["rs"])[m] + dense_updates(adapters["cl"])[m]
            for m in dense_updates(adapters["cl"])}
    pm = peft_model(tiny_base, adapters)
    for kind, method, kw in (("cat", "cat", {}), ("svd", "linear", {"svd_rank": 12})):
        theirs = peft_merge(pm, ["rs", "cl"], [1.0, 1.0], f"p_{kind}", combination_type=kind, **kw)
        mine = ours(adapters, kind, method=method, models=["rs", "cl"])
        for m in want:
            assert float(theirs[m].norm() / want[m].norm()) == pytest.approx(math.sqrt(12), rel=1e-5), (kind, m)
            assert rel(mine[m], want[m]) <= 1e-6, (kind, m)


def test_factorwise_linear_and_ties_are_not_the_method_on_the_update(ours, tiny_base, pair, dense_updates,
                                                                     peft_mu):
    D = {n: dense_updates(p) for n, p in pair.items()}
    w = torch.tensor(W2, dtype=torch.float64)
    pm = peft_model(tiny_base, pair)
    lin = peft_merge(pm, ["a", "b"], W2, "p_lin", combination_type="linear")
    tie = peft_merge(pm, ["a", "b"], W2, "p_ties", combination_type="ties", density=0.5)
    mine_lin = ours(pair, "lin", method="linear", models=[{"model": "a", "weight": W2[0]},
                                                                     {"model": "b", "weight": W2[1]}])
    mine_ties = ours(pair, "ties", method="ties", density=0.5, rank="exact",
                     models=[{"model": "a", "weight": W2[0]}, {"model": "b", "weight": W2[1]}])
    for m in D["a"]:
        want_lin = W2[0] * D["a"][m] + W2[1] * D["b"][m]
        want_ties = peft_mu.ties([D["a"][m], D["b"][m]], w, 0.5, "total")
        assert rel(lin[m], want_lin) > 0.3 and rel(tie[m], want_ties) > 0.3, m  # cross terms B_i A_j, gauge
        assert rel(mine_lin[m], want_lin) <= 1e-6 and rel(mine_ties[m], want_ties) <= 1e-6, m


MERGES = [
    ("linear", {}), ("cat", {}), ("svd", {"rank": 3}), ("ties", {"density": 0.5, "rank": 6}),
    ("ties", {"density": 0.5, "space": "core"}), ("dare_linear", {"density": 0.5, "rank": "exact"}),
    ("dare_ties", {"density": 0.5, "space": "core", "seed": 2}), ("magnitude_prune", {"density": 0.3, "rank": 5}),
    ("slerp", {"t": 0.25, "slerp_scope": "global"}),
    # mergekit's methods (issue 26) and the factored spectral family
    ("task_arithmetic", {"lambda": 0.8, "normalize": True}), ("ties", {"density": 0.5, "normalize": True, "rank": 6}),
    ("breadcrumbs", {"density": 0.6, "gamma": 0.05, "rank": "exact"}),
    ("breadcrumbs_ties", {"density": 0.6, "space": "core"}), ("della", {"density": 0.5, "epsilon": 0.1, "rank": 5}),
    ("della_linear", {"density": 0.5, "epsilon": 0.1, "space": "core"}), ("sce", {"select_topk": 0.5, "rank": 6}),
    ("model_stock", {"filter_wise": True}), ("nuslerp", {"nuslerp_flatten": False}), ("multislerp", {}),
    ("karcher", {}), ("tsv_m", {}), ("iso_c", {"lambda": 1.2}), ("iso_cts", {"rank": 4}),
    ("knots", {"density": 0.5}), ("knots", {"knots_merge": "linear"}), ("svc", {"svc_alpha": 0.5}),
]
UNWEIGHTED = ("slerp", "model_stock", "karcher", "sce")  # methods that take no weights


def test_every_merge_loads_in_peft_and_verifies(tmp_path, tiny_base, peft_adapter, peft_deltas):
    """PEFT's get_delta_weight of each output equals the update vecmerge intended (the written one: the intended
    update itself when lossless, its recorded cut otherwise); verify --base-model adds logits and merge round trip."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from vecmerge.peft.adapter import Adapter
    from vecmerge.pipeline import evaluate, intended

    adapters = {"x": peft_adapter("all_x", seed=31), "y": peft_adapter("all_y", seed=32, r=6, lora_alpha=3)}
    for i, (method, extra) in enumerate(MERGES):
        out = tmp_path / f"{method}{i}"
        models = ["x", "y"] if method in UNWEIGHTED else [{"model": "x", "weight": 0.7}, {"model": "y", "weight": 0.4}]
        rec = Recipe.from_dict({"method": method, "models": models, "inputs": {n: str(p) for n, p in adapters.items()},
                                "out": str(out), **extra})
        rep = run(rec, Workspace(root=tmp_path))
        ev = evaluate(rec, Workspace(root=tmp_path))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            pm = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_base), str(out))
        got = peft_deltas(pm)
        written = Adapter(out)
        assert set(got) == set(ev.names)
        for m in ev.names:
            target = intended(ev, m, 1.0)[0].dense()
            e = rep.outputs[0].figures["modules"][m]["rel_error"]
            if rep.recipe.rank_policy.lossless:
                assert rel(got[m], target) <= 1e-5, (method, m)
            else:  # the recorded cut: its error against the intended update reproduces, and PEFT holds that cut
                assert rel(got[m], target) == pytest.approx(e, rel=1e-4, abs=1e-6), (method, m)
                assert rel(got[m], written.factors(m).dense()) <= 1e-5, (method, m)
        res = verify_output(out, base_model=tiny_base)
        assert res["passed"], (method, [c for c in res["checks"] if not c["passed"]])
