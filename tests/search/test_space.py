"""The space: the parameters, a candidate's recipe and hash, the multipliers' formula, the checks."""

from __future__ import annotations

import re

import pytest

from vecmerge.errors import UsageError
from vecmerge.recipe.recipe import Recipe
from vecmerge.search.space import (
    Space,
    candidate,
    check_space,
    is_plain,
    layer_and_group,
    module_multiplier,
    plain_params,
)

MODULES = tuple(f"model.layers.{i}.{part}" for i in range(3)
                for part in ("self_attn.q_proj", "self_attn.v_proj", "mlp.up_proj", "mlp.down_proj"))


def _space(**kw) -> Space:
    return Space(**{"base": "bb", "dirs": ("t0 - bb",), "modules": MODULES, "trust_max": 0.1,
                    "protect": (("p1", "p1.jsonl"),), "target": (("t", "t.jsonl"),), "base_model": "base",
                    "fingerprint": {"inputs": {"bb": "1" * 64}}, **kw})


def test_the_dims_follow_the_options():
    assert [d.name for d in _space().dims()] == ["trust", "energy"]
    s = _space(dirs=("a", "b"), depth=True, types=True, exclude=("q_proj",), protect=())
    assert [d.name for d in s.dims()] == ["trust", "w0", "w1", "slope", "mix", "x0"]
    assert s.dims()[0].lo == pytest.approx(0.0001) and s.dims()[0].hi == 0.1  # [T/1000, T]


def test_a_plain_dose_has_every_weight_1_and_no_extra():
    s = _space(dirs=("a", "b"), depth=True, types=True, exclude=("q_proj",))
    p = plain_params(s, 0.0123456789)
    assert p == {"trust": 0.0123457, "w0": 1.0, "w1": 1.0, "energy": 0.0, "slope": 0.0, "mix": 0.5, "x0": 0}
    assert is_plain(p) and not is_plain({**p, "energy": 0.9}) and not is_plain({**p, "w1": 0.5})
    c = candidate(s, p)
    assert "protect" not in c.recipe and "multipliers" not in c.recipe and "exclude" not in c.recipe


def test_layer_and_group_and_the_multiplier_formula():
    assert layer_and_group("model.layers.2.self_attn.q_proj") == (2, "model.layers.2.self_attn")
    assert layer_and_group("lm_head") == (None, None)
    # depth(l) = 1 + slope (2 l / (L - 1) - 1); type: attention min(1, 2 (1 - mix)), MLP min(1, 2 mix)
    assert module_multiplier("model.layers.0.mlp.up_proj", 3, 0.5, None) == 0.5
    assert module_multiplier("model.layers.2.mlp.up_proj", 3, 0.5, None) == 1.5
    assert module_multiplier("model.layers.1.mlp.up_proj", 3, 0.5, 0.25) == 0.5
    assert module_multiplier("model.layers.2.self_attn.q_proj", 3, -1.0, 0.25) == 0.0
    assert module_multiplier("model.layers.0.self_attn.q_proj", 3, -1.0, 0.25) == 2.0


def test_a_candidates_recipe_is_a_valid_project_recipe_whose_multipliers_reproduce_its_own():
    s = _space(depth=True, types=True, exclude=(r"layers\.0\.",))
    c = candidate(s, {"trust": 0.05, "energy": 0.9, "slope": 0.5, "mix": 0.25, "x0": 1})
    r = Recipe.from_dict(c.recipe)
    assert r.kind == "project" and r.trust == 0.05 and r.protect_energy == [0.9] and r.protect == {"p1": "p1.jsonl"}
    assert r.exclude == r"(?:layers\.0\.)" and r.target == {"t": "t.jsonl"}
    assert set(c.multipliers) == {m for m in MODULES if ".0." not in m}  # the excluded layer has no step
    for m, f in c.multipliers.items():  # the recipe's first matching pattern gives the candidate's factor
        hit = next((v for k, v in r.multipliers.items() if re.search(k, m)), 1.0)
        assert hit == f == module_multiplier(m, 3, 0.5, 0.25), m


def test_the_hash_is_the_recipe_and_the_inputs():
    s = _space()
    a, b = candidate(s, {"trust": 0.05, "energy": 0.9}), candidate(s, {"trust": 0.0500000001, "energy": 0.9})
    assert a.sha256 == b.sha256 and a.params == {"trust": 0.05, "energy": 0.9}  # 6 significant digits
    assert candidate(s, {"trust": 0.05, "energy": 0.5}).sha256 != a.sha256
    other = _space(fingerprint={"inputs": {"bb": "2" * 64}})
    assert candidate(other, {"trust": 0.05, "energy": 0.9}).sha256 != a.sha256  # another adapter's bytes
    plain = candidate(s, {"trust": 0.05, "energy": 0.0})
    assert "protect" not in plain.recipe and "protect_energy" not in plain.recipe


def test_a_candidate_without_a_step_says_why():
    s = _space(exclude=("layers",), protect=())
    with pytest.raises(UsageError, match="matches all"):
        check_space(s)
    c = candidate(_space(types=True, protect=(), modules=MODULES[:2]), {"trust": 0.05, "mix": 1.0})
    assert c.problem is not None and "zero" in c.problem  # attention only, and mix 1 keeps the MLP only


def test_check_space_refuses_a_bad_space():
    with pytest.raises(UsageError, match="--trust-max"):
        check_space(_space(trust_max=0.0))
    with pytest.raises(UsageError, match="none of"):
        check_space(_space(exclude=("nosuch",)))
    with pytest.raises(UsageError, match="in \\[0, 1\\]"):
        check_space(_space(energies=(0.9, 1.5)))
