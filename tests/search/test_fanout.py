"""Fanned-out evaluation against one process: the same candidates scored by ``Worker`` (in this process) and by a
local CPU Ray (two actors), per-item logliks equal to 1e-6, and ``evaluate_many``'s results equal ``engine.run``'s.

The Ray tests are skipped when ray is not importable (CI does not install it).
"""

from __future__ import annotations

import json
import warnings

import pytest
import torch
from conftest import TINY_DECODER

from vecmerge.errors import UsageError
from vecmerge.evidence.ledger.ledger import Ledger
from vecmerge.search import engine
from vecmerge.search.candidate import build
from vecmerge.search.fanout import Pool, Worker, evaluate_many
from vecmerge.search.optimize import grid
from vecmerge.search.space import candidate
from vecmerge.testing import toy_adapter
from vecmerge.workspace.names import Workspace

TOL = 1e-6  # nats per item: float32 forward passes in two processes on the same batches


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """A random tiny Qwen3, adapters bb and t0 of its shapes, a target and a protected prompt file."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    root = tmp_path_factory.mktemp("fanout")
    config = Qwen3Config(**TINY_DECODER)
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        Qwen3ForCausalLM(config).save_pretrained(root / "base")
    toy_adapter(root / "bb", config=config, rank=4, seed=1, std=0.2)
    toy_adapter(root / "t0", config=config, rank=4, seed=2, std=0.2)
    gen = torch.Generator().manual_seed(0)
    for name, first in (("target", 10), ("protect", 50)):
        rows = [
            {
                "id": i,
                "prompt_ids": [first + i, *torch.randint(2, 96, (1 + i % 3,), generator=gen).tolist()],
                "target_ids": torch.randint(2, 96, (2,), generator=gen).tolist(),
            }
            for i in range(9)
        ]
        (root / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


def _setup(root, ledger=None):
    return engine.prepare(
        Workspace(root=root),
        base="bb",
        dirs=["t0 - bb"],
        target={"t": str(root / "target.jsonl")},
        protect={"p": str(root / "protect.jsonl")},
        margin=0.5,
        trust_max=0.5,
        base_model=root / "base",
        batch=4,
        record_to=ledger,
    )


def _in_process(setup, params):
    c = candidate(setup.space, params)
    return setup.scorer.scores(build(c, setup.factors).updates)


def test_a_worker_scores_a_candidate_from_its_parameters_as_the_engine_does(root):
    setup = _setup(root)
    worker = Worker(root / "base", setup.space, setup.factors, setup.sets, batch=4)
    for params in grid(setup.space, 4, 0):
        sha, got, step = worker.score(params, list(setup.sets))
        c = candidate(setup.space, params)
        built = build(c, setup.factors)
        assert sha == c.sha256 and (step.alpha, step.step, step.kept_direction) == (
            built.alpha,
            built.step,
            built.kept_direction,
        )
        want = _in_process(setup, params)
        assert {s: {i: v["loglik"] for i, v in x.items()} for s, x in got.items()} == {
            s: {i: v["loglik"] for i, v in x.items()} for s, x in want.items()
        }  # one process: bit for bit


def test_a_pool_without_ray_or_with_no_workers_is_refused_in_one_line(root, monkeypatch):
    import builtins

    real = builtins.__import__

    def no_ray(name, *a, **k):
        if name == "ray" or name.startswith("ray."):
            raise ImportError(name)
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_ray)
    with pytest.raises(UsageError, match=r"vecmerge\[ray\]"):
        Pool(object())
    monkeypatch.setattr(builtins, "__import__", real)
    with pytest.raises(UsageError, match="at least 1 worker"):
        Pool(object(), workers=0)


@pytest.fixture(scope="module")
def local_ray():
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.mark.slow
def test_a_local_ray_scores_the_same_candidates_as_one_process(root, local_ray, tmp_path):
    setup = _setup(root)
    params = grid(setup.space, 6, 0)
    with pytest.raises(UsageError, match="has 2 CPU"):
        Pool(setup, workers=3, gpus=False)
    with Pool(setup, workers=2, gpus=False) as pool:
        assert len(pool) == 2 and pool.device == "cpu"
        got = list(pool.score([(p, list(setup.sets)) for p in params]))
        assert pool.forwards() == len(params) * 2 * 3  # 6 candidates, 2 sets of 9 items in batches of 4
    for p, (sha, scores, _) in zip(params, got):
        assert sha == candidate(setup.space, p).sha256
        want = _in_process(setup, p)
        assert scores.keys() == want.keys() == {"t", "p"}
        for s in want:
            assert scores[s].keys() == want[s].keys()
            for i in want[s]:
                assert abs(scores[s][i]["loglik"] - want[s][i]["loglik"]) <= TOL, (s, i)
                assert scores[s][i]["first_rank"] == want[s][i]["first_rank"]
    assert local_ray.is_initialized()  # the pool left the caller's Ray running


@pytest.mark.slow
def test_evaluate_many_gives_the_engines_results_and_replays_the_ledger(root, local_ray, tmp_path):
    one = _setup(root, Ledger(tmp_path / "one.db"))
    want = engine.run(one, budget=5, seed=3, sampler="grid").results
    fan = _setup(root, Ledger(tmp_path / "fan.db"))
    params = grid(fan.space, 5, 3)
    with Pool(fan, workers=2, gpus=False) as pool:
        many = evaluate_many(fan, pool)
        first = many(params)
        again = many(params)
    for a, b in zip(first, want):
        assert a.sha256 == b.sha256 and a.feasible == b.feasible and a.computed and b.computed
        assert a.step == pytest.approx(b.step, rel=1e-12)
        for s in ("t", "p"):
            fa, fb = (a.target | a.protect)[s], (b.target | b.protect)[s]
            assert abs(fa.mean - fb.mean) <= TOL and abs(fa.lower - fb.lower) <= 2 * TOL, s
    assert not any(r.computed for r in again)  # every candidate replayed from the driver's ledger
    assert [r.to_dict() | {"computed": True} for r in again] == [r.to_dict() for r in first]


@pytest.mark.slow
def test_the_engine_with_a_pool_proposes_and_judges_as_in_one_process(root, local_ray, tmp_path):
    one = engine.run(_setup(root, Ledger(tmp_path / "one.db")), budget=6, seed=1, sampler="grid")
    fan, seen = _setup(root, Ledger(tmp_path / "fan.db")), []
    with Pool(fan, workers=2, gpus=False) as pool:
        got = engine.run(fan, budget=6, seed=1, sampler="grid", pool=pool, on_result=lambda r, rs: seen.append(len(rs)))
        tpe = [
            engine.run(_setup(root, Ledger(tmp_path / f"tpe{i}.db")), budget=4, seed=1, sampler="tpe", pool=pool)
            for i in range(2)
        ]
    assert len(one.results) == 6 and seen == [1, 2, 3, 4, 5, 6]  # told and reported one by one, asked two by two
    assert got.forwards == one.forwards == 6 * 2 * 3  # the workers' forward passes counted
    assert [r.sha256 for r in got.results] == [r.sha256 for r in one.results]
    for a, b in zip(got.results, one.results):
        assert abs(a.objective - b.objective) <= TOL and a.feasible == b.feasible and a.computed
    assert [r.sha256 for r in tpe[0].results] == [r.sha256 for r in tpe[1].results]  # seeded with a pool too
