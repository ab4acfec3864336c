"""The samplers: the grid's levels and order, the same seed and budget giving the same candidates, TPE."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from vecmerge.errors import UsageError
from vecmerge.search.optimize import grid, search
from vecmerge.search.space import Space

MODULES = ("model.layers.0.self_attn.q_proj", "model.layers.1.mlp.up_proj")


def _space(**kw) -> Space:
    return Space(**{"base": "bb", "dirs": ("d",), "modules": MODULES, "trust_max": 0.2,
                    "protect": (("p", "p.jsonl"),), **kw})


def _fake(params):
    """A cheap stand-in: gain grows with the trust, protected change falls with it unless protected."""
    t, e = params["trust"], params.get("energy", 0.0)
    worst = -t * (1.0 - e)
    return SimpleNamespace(sha256=repr(sorted(params.items())), params=params, objective=10 * t * (1 - 0.5 * e),
                           worst=worst, feasible=worst >= -0.05, target={"t": 1},
                           constraints=lambda margins, tm, w=worst: [-0.05 - w])


def test_the_grid_grows_round_robin_within_the_budget_and_covers_each_level():
    pts = grid(_space(), 12, seed=0)
    assert len(pts) == 12 and len({tuple(sorted(p.items())) for p in pts}) == 12
    # trust 2, energy 2, trust 3, energy 3, trust 4 (12): energy 4 would need 16
    assert sorted({p["energy"] for p in pts}) == [0.0, 0.9, 0.99]  # 0.9 first, then the plain step, then 0.99
    assert sorted({p["trust"] for p in pts}) == pytest.approx([0.01, 0.07333333, 0.13666667, 0.2])
    assert grid(_space(), 12, seed=0) == pts and grid(_space(), 12, seed=1) != pts  # the seed orders the visit
    assert sorted(map(repr, grid(_space(), 12, seed=1))) == sorted(map(repr, pts))


@pytest.mark.parametrize("sampler", ["grid", "tpe"])
def test_the_same_seed_and_budget_give_the_same_candidates(sampler):
    pytest.importorskip("optuna") if sampler == "tpe" else None
    runs = [search(_space(), _fake, budget=12, seed=s, sampler=sampler, margins={"p": 0.05})[0] for s in (3, 3, 4)]
    same, other = ([r.sha256 for r in rs] for rs in runs[:2]), [r.sha256 for r in runs[2]]
    a, b = same
    assert a == b and a != other


def test_tpe_finds_a_feasible_candidate_better_than_the_plain_one():
    pytest.importorskip("optuna")
    rs, used = search(_space(), _fake, budget=25, seed=0, sampler="tpe", margins={"p": 0.05})
    best = max((r for r in rs if r.feasible), key=lambda r: r.objective)
    assert used == "tpe" and best.params["energy"] > 0 and best.objective > 10 * 0.05  # plain: t <= 0.05


def test_the_loop_reports_each_result_and_stops_on_an_interrupt():
    seen = []

    def stop(r, results):
        seen.append(r)
        if len(results) == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        search(_space(), _fake, budget=5, seed=0, sampler="grid", margins={}, on_result=stop)
    assert len(seen) == 2


def test_bad_budgets_and_samplers_are_refused():
    with pytest.raises(UsageError, match="--budget 0"):
        search(_space(), _fake, budget=0, seed=0, margins={})
    with pytest.raises(UsageError, match="--sampler"):
        search(_space(), _fake, budget=1, seed=0, sampler="cma", margins={})
    assert math.isfinite(grid(_space(), 1, 0)[0]["trust"])
