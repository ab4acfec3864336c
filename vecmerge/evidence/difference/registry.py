"""The registry of difference tests: name -> test, one file per test in this package (as ``methods/`` does).

A test declares what data it needs, where it stands in the decision order and in reports, and runs on
``Scores``; ``compare`` and ``subscores`` take the first applicable test in the decision order, ``report``
shows a row per registered test, the gate and the ledger's plans look tests up by name here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol, TypeVar, cast

from .. import EvidenceError
from .result import DiffResult

RUNS, ITEMS, BINARY_ITEMS, CLUSTERS, PLAN = "runs", "items", "binary items", "clusters", "plan"
NEEDS = (RUNS, ITEMS, BINARY_ITEMS, CLUSTERS, PLAN)


@dataclass(frozen=True)
class Scores:
    """What two models A and B scored, as the tests read it.

    Args:
        runs_a, runs_b (tuple[float, ...]): whole-run values, in record order.
        items_a, items_b (Mapping[str, float]): item id -> the mean of that model's records of the item.
        clusters (Mapping[str, str]): item id -> cluster key; items without one are their own cluster.
        min_items (int): fewer items scored by both give no item-level test.
    """

    runs_a: tuple[float, ...] = ()
    runs_b: tuple[float, ...] = ()
    items_a: Mapping[str, float] = field(default_factory=dict)
    items_b: Mapping[str, float] = field(default_factory=dict)
    clusters: Mapping[str, str] = field(default_factory=dict)
    min_items: int = 2

    def common(self) -> list[str]:
        """The items both models scored, sorted; empty when fewer than ``max(min_items, 2)``."""
        common = sorted(set(self.items_a) & set(self.items_b))
        return common if len(common) >= max(self.min_items, 2) else []


class DifferenceTest(Protocol):
    """One test of A - B. ``needs``: one of ``NEEDS`` (``plan``: a pre-registered sequential test, judged by
    ``stats.sequential`` from a plan's looks, never run by ``compare``). ``decides``: its place in the decision
    order (lower first); ``shown``: its place in reports and JSON. ``size``: the report's n column."""

    @property
    def name(self) -> str: ...

    @property
    def summary(self) -> str: ...

    @property
    def needs(self) -> str: ...

    @property
    def decides(self) -> int: ...

    @property
    def shown(self) -> int: ...

    def run(self, scores: Scores, confidence: float) -> DiffResult | None: ...

    def size(self, result: Mapping) -> str: ...


_REGISTRY: dict[str, DifferenceTest] = {}
T = TypeVar("T")


def register(test: T) -> T:
    """Add ``test`` (a DifferenceTest class, instantiated once, or instance) under its ``name``; returns it."""
    inst = cast(DifferenceTest, test() if isinstance(test, type) else test)
    if not inst.name or inst.needs not in NEEDS:
        raise ValueError(f"{test!r}: a test needs a name and needs one of {', '.join(NEEDS)}")
    _REGISTRY[inst.name] = inst
    return test


@dataclass(frozen=True)
class PlanTest:
    """A sequential test a plan stores by name, judged from the plan's looks (``stats``), never by ``compare``.

    Args:
        name (str): the stored name. summary (str): one line for people.
    """

    name: str
    summary: str
    needs: str = PLAN
    decides: int = 0
    shown: int = 0

    def run(self, scores: Scores, confidence: float) -> DiffResult | None:
        return None  # a plan's looks decide (stats.sequential, stats.planned), not two score sets

    def size(self, result: Mapping) -> str:
        return ""


def unregister(name: str) -> None:
    """Remove a test (tests that register a toy one)."""
    _REGISTRY.pop(name, None)


def get(name: str) -> DifferenceTest:
    """The test called ``name``; EvidenceError listing the known ones otherwise."""
    if name not in _REGISTRY:
        raise EvidenceError(f"test {name!r}: use one of {', '.join(sorted(_REGISTRY))}")
    return _REGISTRY[name]


def names(*, plan: bool = False) -> tuple[str, ...]:
    """Registered difference tests (``plan=True``: the sequential tests plans store), sorted by name."""
    return tuple(sorted(n for n, t in _REGISTRY.items() if (t.needs == PLAN) == plan))


def decision_order() -> tuple[DifferenceTest, ...]:
    """The tests ``compare`` runs, in the order the verdict takes them (the first with a result decides)."""
    return tuple(sorted((t for t in _REGISTRY.values() if t.needs != PLAN), key=lambda t: (t.decides, t.name)))


def report_order() -> tuple[DifferenceTest, ...]:
    """The same tests in the order reports and JSON show them."""
    return tuple(sorted((t for t in _REGISTRY.values() if t.needs != PLAN), key=lambda t: (t.shown, t.name)))


def run_all(scores: Scores, confidence: float) -> dict[str, DiffResult | None]:
    """Every registered test run on ``scores``, in report order: name -> result (None: not applicable)."""
    return {t.name: t.run(scores, confidence) for t in report_order()}


def deciding(results: Mapping[str, DiffResult | None]) -> DiffResult | None:
    """The first result in the decision order (None when no test applied)."""
    return next((results[t.name] for t in decision_order() if results.get(t.name) is not None), None)


def first_needing(needs: str, results: Mapping[str, DiffResult | None]) -> tuple[bool, DiffResult | None]:
    """(whether a registered test needs ``needs``, the result of the first such test in the decision order)."""
    tests = [t for t in decision_order() if t.needs == needs]
    return bool(tests), results.get(tests[0].name) if tests else None
