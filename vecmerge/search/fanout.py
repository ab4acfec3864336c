"""Evaluation fanned out on Ray (the optional extra ``ray``; imported only when a ``Pool`` is made).

    workers   one actor per GPU of the Ray cluster; without GPUs ``workers`` CPU actors (default 1)
    once      per worker: the base model loaded from its folder, the prompt sets cut into batches, the search's
              shared ``Factors`` (backbone, directions, the protected inputs' decompositions, made once by the
              driver) through Ray's object store
    per item  the driver sends a candidate's parameters (a small dict) and the sets to score; the worker builds
              its exact factors itself (``space.candidate`` then ``candidate.build``, the one-process path), checks
              the recipe hash, runs probe's hooks and returns per set, per item ``loglik``, ``exact``,
              ``first_rank`` and the step (``alpha``, ``step``, ``kept_direction``)

The ledger stays with the driver: ``evaluate_many`` replays what it holds, fans out the rest and records each
candidate in one transaction as its scores come back, so the figures equal one process's (tested to 1e-6).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import UsageError
from .candidate import build, linear_modules
from .evaluate import Scorer, cached, judge, record
from .space import candidate


@dataclass(frozen=True)
class Step:
    """A candidate's step as a worker reports it (``candidate.Built`` without the factors)."""

    alpha: float
    step: float
    kept_direction: float


class Worker:
    """One device's evaluator: the base loaded once, candidates built and scored from their parameters.

    Args:
        base_model (str | Path): the model folder. space (Space): the search's space. factors (Factors): shared.
        sets (dict[str, PromptSet]): name -> items. batch (int): items per forward pass. device (str): cpu, cuda.
        threads (int | None): torch's CPU threads in this worker (None: torch's default).
    """

    def __init__(
        self, base_model, space, factors, sets: dict, *, batch: int = 8, device: str = "cpu", threads: int | None = None
    ):
        from ..probe.runner import load_base

        if threads:
            torch.set_num_threads(threads)
        self.space, self.factors = space, factors
        model = load_base(Path(base_model), torch.device(device))
        self.scorer = Scorer(model, factors.modules, sets, batch=batch, device=device)

    def score(self, params: dict, names: list) -> tuple[str, dict, Step]:
        """``(recipe hash, {set: {item id: scores}}, Step)`` of the candidate of ``params`` on the sets ``names``."""
        c = candidate(self.space, params)
        built = build(c, self.factors, device=self.scorer.device)
        return c.sha256, self.scorer.scores(built.updates, names), Step(built.alpha, built.step, built.kept_direction)

    def forwards(self) -> int:
        return self.scorer.forwards


def ray_module():
    """The ``ray`` module, or a one-line UsageError naming --workers and the extra to install."""
    try:
        import ray
    except ImportError:
        raise UsageError(
            "--workers: fanning out needs Ray: pip install 'vecmerge[ray]' (or leave --workers out "
            "to evaluate in one process)"
        ) from None
    return ray


class Pool:
    """Ray actors holding a ``Worker`` each, fed candidates in order (a context manager: ``close`` on exit).

    Joins the running Ray (``ray.init`` by the caller, a cluster's address) or starts a local one, which ``close``
    stops. One actor per GPU the cluster has (each ``num_gpus=1``, on ``cuda``); without GPUs ``workers`` actors
    on the CPU, each with ``cpus // workers`` torch threads.

    Args:
        setup (engine.Setup): ``engine.prepare``'s (its space, factors, sets, batch). workers (int | None): CPU
            actors when there is no GPU (default 1). gpus (bool): use the cluster's GPUs when it has some.
    """

    def __init__(self, setup, *, workers: int | None = None, gpus: bool = True):
        if workers is not None and workers < 1:
            raise UsageError(f"--workers {workers}: give at least 1 worker")
        ray = self.ray = ray_module()
        self.started = not ray.is_initialized()
        if self.started:
            ray.init(include_dashboard=False, log_to_driver=False)
        res = ray.cluster_resources()
        n_gpu = int(res.get("GPU", 0)) if gpus else 0
        cpus = max(1, int(res.get("CPU", 1)))
        n = n_gpu or (workers or 1)
        if not n_gpu and n > cpus:
            self.actors = []
            self.close()  # the Ray this started, if any
            raise UsageError(f"--workers {n}: the Ray cluster has {cpus} CPU(s); give at most {cpus}")
        opts = {"num_gpus": 1, "num_cpus": 1} if n_gpu else {"num_cpus": 1}
        device, threads = ("cuda", None) if n_gpu else ("cpu", max(1, cpus // n))
        if setup.factors.grams is not None:  # decomposed once here (engine.prepare does it), never per worker
            setup.factors.decompose(linear_modules(setup.factors))
        factors = ray.put(setup.factors)
        sets = ray.put(setup.sets)
        # the driver's batch as its scorer cut the sets (the largest chunk), so that the batches are the same
        batch = max((len(chunk) for b in setup.scorer.batches.values() for chunk, _ in b), default=1)
        actor = ray.remote(**opts)(Worker)
        folder = str(Path(setup.space.base_model).resolve())  # a worker's working folder may be another
        self.actors = [
            actor.remote(folder, setup.space, factors, sets, batch=batch, device=device, threads=threads)
            for _ in range(n)
        ]
        self.device = device

    def __len__(self) -> int:
        return len(self.actors)

    def score(self, jobs: list):
        """Yield each ``Worker.score`` of ``jobs`` (``(params, names)`` pairs) in order, as it comes back."""
        from ray.util import ActorPool

        return ActorPool(self.actors).map(lambda a, job: a.score.remote(*job), list(jobs))

    def forwards(self) -> int:
        """The forward passes the workers ran."""
        return sum(self.ray.get([a.forwards.remote() for a in self.actors]))

    def close(self) -> None:
        for a in self.actors:
            self.ray.kill(a)
        self.actors = []
        if self.started and self.ray.is_initialized():
            self.ray.shutdown()

    def __enter__(self) -> Pool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def evaluate_many(setup, pool: Pool) -> Callable[[list], list]:
    """The engine's hook: ``f(list of params) -> list of Result`` (in order), the scoring fanned out on ``pool``.

    Per candidate as in one process (``engine.run``): a candidate with a problem is judged without scores; the
    ledger's scores are replayed; the missing sets are scored by a worker, recorded (one transaction) and judged.

    Args:
        setup (engine.Setup): ``engine.prepare``'s. pool (Pool): the workers.
    """
    s = setup

    def kw(computed: bool) -> dict:
        return dict(
            targets=s.targets, protect=s.protect, margins=s.margins, trust_max=s.space.trust_max, computed=computed
        )

    def run(many: list) -> list:
        out: list = [None] * len(many)
        jobs, waiting = [], []
        for j, params in enumerate(many):
            c = candidate(s.space, params)
            if c.problem:
                out[j] = judge(c, None, {}, {}, **kw(False))
                continue
            got = cached(s.ledger, s.sets, c.key, c.sha256)
            todo = [n for n in s.sets if n not in got]
            if not todo:
                out[j] = judge(c, build(c, s.factors), got, s.baseline, **kw(False))
                continue
            jobs.append((params, todo))
            waiting.append((j, c, got))
        for (j, c, got), (sha, fresh, step) in zip(waiting, pool.score(jobs)):
            if sha != c.sha256:  # the worker's space or inputs differ from the driver's: never record it
                raise RuntimeError(f"candidate {c.sha256[:12]}: a worker built {sha[:12]}")
            record(s.ledger, s.sets, c.key, c.sha256, fresh)
            got.update(fresh)
            out[j] = judge(c, step, got, s.baseline, **kw(True))
        return out

    return run
