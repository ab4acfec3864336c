"""The samplers that propose candidates, and the loop that evaluates them: seeded, so a seed and a budget give
the same candidates, and resumable, since every evaluation is in the ledger before the next one starts.

    line   first, the plain dose (energy 0, no extras) by a line search on trust: feasibility falls as trust grows,
           so trust_max, then /10 down to trust_max/1000 until one is feasible (the bracket), then bisection on
           log trust; ``line_budget`` evaluations out of the budget, recorded like any candidate
    grid   (no extra needed) a product of levels per parameter, grown round-robin (trust first, then the
           energy, the weights, the mix, the slope, the exclusions) while it fits the budget; visited in a seeded
           random order, so that a cut budget still spreads over the space. Trust levels are log-spaced from the
           best plain dose's trust (smaller steps gain less than that baseline) or, without one, trust_max/1000
    tpe    optuna's TPE with constraints (``constraints_func``: ``-M - lower`` per protected set and the step
           over ``trust_max``, each ``<= 0`` when it holds), seeded; told every sampled result, replayed ones
           included; trust on a log scale over [trust_max/1000, trust_max]
"""

from __future__ import annotations

import contextlib
import math
import random
import warnings
from collections.abc import Callable
from typing import Any

from ..errors import UsageError
from .space import Dim, Space, is_plain, plain_params, rounded

SAMPLERS = ("auto", "grid", "tpe")
MAX_LEVELS = 64
LINE_MAX = 8  # the plain dose's line search: at most this many evaluations
_PRIORITY = ("trust", "energy", "w", "mix", "slope", "x")


def _levels(d: Dim, n: int) -> list:
    if d.choices:
        # energies: 0.9 (the default), then 0 (the plain step), then the others from the highest
        order = sorted(d.choices, key=lambda v: (v not in (0.9, 0.0), v != 0.9, -v)) if d.name == "energy" \
            else list(d.choices)
        return order[:n]
    if d.name == "trust":  # a log scale: lo * (hi / lo) ** (k / (n - 1))
        return [d.hi] if n == 1 else [d.lo * (d.hi / d.lo) ** (k / (n - 1)) for k in range(n)]
    if n == 1:
        return [{"slope": 0.0, "mix": 0.5}.get(d.name, 1.0)]
    return [d.lo + (d.hi - d.lo) * k / (n - 1) for k in range(n)]


def grid(space: Space, budget: int, seed: int, floor: float | None = None) -> list[dict]:
    """The grid's candidates' parameters (module docstring), at most ``budget``, in the seed's order.

    Args:
        space (Space). budget (int). seed (int). floor (float | None): the lowest trust level (None: the space's).
    """
    dims = [Dim("trust", floor, d.hi) if d.name == "trust" and floor is not None and d.lo < floor < d.hi else d
            for d in space.dims()]
    dims = sorted(dims, key=lambda d: next(i for i, p in enumerate(_PRIORITY) if d.name.startswith(p)))
    sizes = {d.name: 1 for d in dims}
    cap = {d.name: len(d.choices) if d.choices else MAX_LEVELS for d in dims}
    grown = True
    while grown:
        grown = False
        for d in dims:
            total = math.prod(sizes.values())
            if sizes[d.name] < cap[d.name] and total // sizes[d.name] * (sizes[d.name] + 1) <= budget:
                sizes[d.name] += 1
                grown = True
    points: list[dict] = [{}]
    for d in dims:
        points = [{**p, d.name: v} for p in points for v in _levels(d, sizes[d.name])]
    random.Random(seed).shuffle(points)
    return points[:budget]


def search(space: Space, evaluate: Callable, *, budget: int, seed: int, sampler: str = "auto", margins: dict,
           progress=None, on_result: Callable | None = None, evaluate_many: Callable | None = None,
           parallel: int = 1) -> tuple[list, str]:
    """Evaluate up to ``budget`` candidates proposed by ``sampler``; ``(results, sampler used)``.

    Args:
        space (Space). evaluate (Callable[[dict], Result]): scores one parameter set (and records it).
        budget (int): candidates. seed (int). sampler (str): auto (tpe when optuna is installed), grid or tpe.
        margins (dict[str, float]): M per protected set. progress: an optional iterable wrapper (tqdm).
        on_result (Callable[[Result, list], None] | None): called after each result with the results so far.
        evaluate_many (Callable[[list[dict]], list[Result]] | None): scores ``parallel`` proposals at once
            (``fanout.evaluate_many``); they are asked before any is told.
    """
    if budget < 1:
        raise UsageError(f"--budget {budget}: evaluate at least 1 candidate")
    if sampler not in SAMPLERS:
        raise UsageError(f"--sampler {sampler}: use one of {', '.join(SAMPLERS)}")
    if sampler == "auto":
        sampler = "tpe" if _has_optuna() else "grid"
    if sampler == "tpe" and not _has_optuna():
        raise UsageError("--sampler tpe needs optuna: pip install 'vecmerge[search]' (or use --sampler grid)")
    steps = range(budget)
    bar = progress(steps) if progress else steps
    results: list = []
    line = _Line(space, line_budget(budget))
    propose: Any = None
    teller: Any = None
    queue: list = []
    for _ in bar:
        if not queue:
            if not line.done:
                asked, teller = [line.ask()], line
            else:
                if propose is None:  # the sampler gets what the line search left
                    rest = budget - len(results)
                    plain = best_plain(results)
                    propose = (_Grid(space, rest, seed, [r.params for r in results],
                                     plain.params["trust"] if plain is not None else None) if sampler == "grid"
                               else _Tpe(space, seed, rest, margins))
                n = min(parallel, budget - len(results))
                asked, teller = [p for p in (propose.ask() for _ in range(n)) if p is not None], propose
            queue = list(evaluate_many(asked)) if evaluate_many and asked else [evaluate(p) for p in asked]
        if not queue:
            break
        r = queue.pop(0)
        teller.tell(r)
        results.append(r)
        best = max((x for x in results if x.feasible), key=lambda x: x.objective, default=None)
        if hasattr(bar, "set_postfix_str"):
            bar.set_postfix_str("best feasible: none" if best is None else f"best feasible {best.objective:+.4g}")
        if on_result is not None:
            on_result(r, results)
    return results, sampler


def line_budget(budget: int) -> int:
    """The plain dose's line search's evaluations out of ``budget``: ``min(LINE_MAX, max(1, budget // 4))``."""
    return min(LINE_MAX, max(1, budget // 4))


def best_plain(results: list):
    """The feasible plain dose (``space.is_plain``) of the highest gain among ``results``, or None."""
    return max((r for r in results if r.feasible and is_plain(r.params)), key=lambda r: r.objective, default=None)


class _Line:
    """The plain dose's line search (module docstring): ``n`` evaluations at most, one at a time."""

    def __init__(self, space: Space, n: int):
        self.space, self.n, self.told = space, n, 0
        self.floor = space.dims()[0].lo
        self.lo: float | None = None  # the largest feasible trust so far
        self.hi: float | None = None  # the smallest infeasible one
        self.next: float | None = space.trust_max

    @property
    def done(self) -> bool:
        return self.next is None or self.told >= self.n

    def ask(self) -> dict:
        return plain_params(self.space, self.next if self.next is not None else self.space.trust_max)

    def tell(self, result) -> None:
        self.told += 1
        t = result.params["trust"]
        if result.feasible:
            self.lo = t if self.lo is None else max(self.lo, t)
        else:
            self.hi = t if self.hi is None else min(self.hi, t)
        if self.hi is None:  # trust_max itself is feasible
            self.next = None
        elif self.lo is None:  # the bracket: a tenth each time, down to the floor
            self.next = max(self.hi / 10, self.floor) if self.hi > self.floor * (1 + 1e-9) else None
        else:  # bisection on log trust, until the bracket is within 2%
            self.next = math.sqrt(self.lo * self.hi) if self.hi / self.lo > 1.02 else None


def _rounded(params: dict) -> dict:
    return {k: rounded(v) if isinstance(v, float) else v for k, v in params.items()}


def _has_optuna() -> bool:
    try:
        import optuna  # noqa: F401
    except ImportError:
        return False
    return True


class _Grid:
    def __init__(self, space: Space, budget: int, seed: int, seen: list | tuple = (), floor: float | None = None):
        done = [_rounded(p) for p in seen]  # the line search's: not evaluated twice
        self.points = [p for p in grid(space, budget + len(done), seed, floor) if _rounded(p) not in done][:budget]

    def ask(self) -> dict | None:
        return self.points.pop(0) if self.points else None

    def tell(self, result) -> None:
        pass


class _Tpe:
    """optuna's constrained TPE through ask and tell (its experimental warnings silenced)."""

    def __init__(self, space: Space, seed: int, budget: int, margins: dict):
        import optuna

        self.optuna, self.space, self.margins = optuna, space, margins
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        with self._quiet():
            sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=max(1, min(10, budget // 3)),
                                                 constraints_func=lambda t: t.user_attrs["constraints"])
            self.study = optuna.create_study(direction="maximize", sampler=sampler)
        self.trials: list[Any] = []

    @staticmethod
    @contextlib.contextmanager
    def _quiet():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield

    def ask(self) -> dict:
        with self._quiet():
            t = self.study.ask()
            self.trials.append(t)
            return {d.name: t.suggest_categorical(d.name, list(d.choices)) if d.choices
                    else t.suggest_float(d.name, d.lo, d.hi, log=d.name == "trust") for d in self.space.dims()}

    def tell(self, result) -> None:
        value = result.objective if math.isfinite(result.objective) else -1e9
        cons = result.constraints(self.margins, self.space.trust_max) if result.target else [1e9]
        with self._quiet():
            trial = self.trials.pop(0)
            trial.set_user_attr("constraints", [c if math.isfinite(c) else 1e9 for c in cons])
            self.study.tell(trial, value)
