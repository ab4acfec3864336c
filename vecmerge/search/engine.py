"""A search from start to finish, nothing written but the ledger: inputs checked, the base loaded once, the
protected Grams captured once, the backbone scored once, then each proposed candidate built (``candidate.py``),
scored unless the ledger holds it (``evaluate.py``), recorded, and the front and top K taken (``front.py``).

Interrupted (Ctrl-C), every finished candidate is in the ledger; the same command again replays them.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..errors import UsageError
from ..evidence.ledger.ledger import Ledger
from ..probe import records
from ..probe.capture import capture_grams
from ..probe.prompts import model_context, read_prompts
from ..probe.runner import load_base
from .candidate import Factors, backbone_updates, build, linear_modules
from .evaluate import BOUND, Result, Scorer, cached, judge, record
from .fanout import evaluate_many
from .front import front, top
from .optimize import best_plain, search
from .space import ENERGIES, Space, candidate, check_space

ZERO = 1e-9  # a direction whose norm is at most this share of the backbone's is zero


@dataclass
class Setup:
    """A search ready to run: the space, the shared factors, the scorer, the sets, the backbone's scores."""

    space: Space
    factors: Factors
    scorer: Scorer
    sets: dict
    targets: list
    protect: list
    margins: dict
    ledger: Ledger | None
    baseline: dict = field(default_factory=dict)


def _overlap(target, other) -> int:
    mine = {it.prompt_ids for it in target.items}
    return sum(1 for it in other.items if it.prompt_ids in mine)


def read_sets(target: dict, protect: dict, base_model: Path) -> dict:
    """The prompt sets, read with the base model's tokenizer; UsageError when a protected set shares a prompt with
    the target (a protected set must hold what the step should leave alone)."""
    if len(target) != 1:
        raise UsageError(f"--target: give exactly one NAME=PROMPTS (got {len(target)})")
    if not protect:
        raise UsageError("--protect: give at least one NAME=PROMPTS to hold (the constraints)")
    clash = sorted(set(target) & set(protect))
    if clash:
        raise UsageError(f"--protect {clash[0]}: the name is also a --target; name each set once")
    sets = {n: read_prompts(p, base_model, stem=n) for n, p in {**target, **protect}.items()}
    t = sets[next(iter(target))]
    for n in protect:
        shared = _overlap(t, sets[n])
        if shared:
            raise UsageError(f"--protect {n}={protect[n]}: {shared} of its prompts are also in the target's "
                             f"{t.path}; a protected set must not hold the target's prompts; remove them")
    return sets


def prepare(ws, *, base: str, dirs: list, target: dict, protect: dict, margin, trust_max: float,
            base_model, depth: bool = False, types: bool = False, exclude=(), energies=None, batch: int = 8,
            record_to: Ledger | None = None, progress=None) -> Setup:
    """Check the inputs, load the base once, capture the protected Grams and score the backbone.

    Args:
        ws (Workspace): names and the device. base (str), dirs (list[str]): expressions. target, protect
        (dict[str, str]): name -> prompt file. margin (float | dict[str, float]): M, one for all or per set.
        trust_max (float). base_model (str | Path). depth, types (bool), exclude (Iterable[str]), energies
        (Iterable[float] | None): the space. batch (int): items per forward pass. record_to (Ledger | None).
    """
    margins = dict(margin) if isinstance(margin, dict) else {n: float(margin) for n in protect}
    for n, m in margins.items():
        if n not in protect:
            raise UsageError(f"--margin {n}={m}: {n} is not a --protect set")
        if not m >= 0:
            raise UsageError(f"--margin {m}: a margin is a drop allowed, >= 0 (in the loglik's nats)")
    missing = [n for n in protect if n not in margins]
    if missing:
        raise UsageError(f"--margin: no margin for the protected set {missing[0]}; give one M for all or NAME=M")
    if batch < 1:
        raise UsageError(f"--batch {batch}: at least 1 item per forward pass")
    folder = Path(base_model)
    backbone = ws.evaluate(base)
    vectors = [ws.evaluate(d) for d in dirs]
    scale = math.sqrt(sum(x.norm() ** 2 for x in backbone.modules.values()))
    for d, v in zip(dirs, vectors):
        if set(v.modules) != set(backbone.modules):
            raise UsageError(f"--dir {d}: its modules differ from the backbone's ({base}); search over adapters "
                             "of the same modules")
        if math.sqrt(sum(x.norm() ** 2 for x in v.modules.values())) <= ZERO * max(scale, 1e-30):
            raise UsageError(f"--dir {d}: the direction is zero (its norm is 0 to {ZERO:g} of the backbone's); "
                             "give adapters that differ, e.g. 't0 - bb'")
    sets = read_sets(target, protect, folder)
    names = sorted({n for e in [base, *dirs] for n in _names(e)})
    fp = {"inputs": {n: ws.content_sha(n) for n in names}, "prompts": {n: s.sha256 for n, s in sets.items()},
          "base_model": _config_sha(folder)}
    space = Space(base, tuple(dirs), tuple(backbone.modules), float(trust_max), tuple(sorted(protect.items())),
                  tuple(target.items()), str(folder), depth, types, tuple(exclude),
                  tuple(energies) if energies is not None else ENERGIES, fp)
    check_space(space)
    if record_to is not None:
        for n, ps in sets.items():
            _check_name(record_to, ps, "--target" if n in target else "--protect", n, {**target, **protect}[n])
    device = torch.device(ws.device or "cpu")
    model = load_base(folder, device)
    for ps in sets.values():
        ps.check_vocab(model.get_input_embeddings().num_embeddings, f"--base-model {folder}")
        ps.check_context(model_context(model.config), f"--base-model {folder}")
    factors = Factors(backbone, vectors, protect=list(protect))
    bb = backbone_updates(factors, device=device)
    if protect:
        factors.grams = capture_grams(model, bb, {n: sets[n] for n in protect}, linear_modules(factors),
                                      batch=batch, device=device, progress=progress)
        factors.decompose(linear_modules(factors))
    setup = Setup(space, factors, Scorer(model, factors.modules, sets, batch=batch, device=device), sets,
                  list(target), list(protect), margins, record_to)
    key, sha = _backbone_key(space)
    setup.baseline = cached(record_to, sets, key, sha)
    if len(setup.baseline) < len(sets):
        fresh = setup.scorer.scores(bb, [n for n in sets if n not in setup.baseline])
        record(record_to, sets, key, sha, fresh)
        setup.baseline.update(fresh)
    return setup


def _check_name(ledger: Ledger, ps, flag: str, name: str, file: str) -> None:
    """UsageError when the ledger holds the set ``name`` (``probe:<name>:*``) of another prompt file."""
    try:
        records.check_stem(ledger, ps)
    except UsageError:
        raise UsageError(f"{flag} {name}={file}: the ledger {ledger.path} already holds the set {name} of another "
                         f"prompt file (a set's name stands for one file); give this file another NAME, e.g. "
                         f"{flag} {name}2={file}") from None


def _names(expr: str) -> list:
    from ..expr import parse

    return parse(expr).names()


def _config_sha(folder: Path) -> str | None:
    cfg = folder / "config.json"
    return hashlib.sha256(cfg.read_bytes()).hexdigest() if cfg.is_file() else None


def _backbone_key(space: Space) -> tuple[str, str]:
    text = json.dumps({"backbone": space.base, "inputs": space.fingerprint}, sort_keys=True)
    sha = hashlib.sha256(text.encode()).hexdigest()
    return f"search-backbone-{sha[:16]}", sha


def search_id(space: Space, seed: int, sampler: str) -> str:
    """The search's id: its space, inputs, seed and sampler (not its budget, so a longer run continues it)."""
    text = json.dumps({"space": space.to_dict(), "inputs": space.fingerprint, "seed": seed, "sampler": sampler},
                      sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass
class Outcome:
    """A finished search (``to_dict`` is the search record, ``--json``)."""

    id: str
    space: Space
    seed: int
    sampler: str
    budget: int
    margins: dict
    results: list
    front: list
    top: list
    forwards: int
    plain: Result | None = None  # the best feasible plain dose (``optimize.best_plain``), the baseline

    def to_dict(self) -> dict:
        p = self.plain
        plain = None if p is None else {"sha256": p.sha256, "trust": p.params["trust"], "gain": p.objective,
                                        "worst_protected": p.worst}
        computed = sum(1 for r in self.results if r.computed and r.target)
        return {"id": self.id, "space": self.space.to_dict(), "inputs": self.space.fingerprint, "seed": self.seed,
                "sampler": self.sampler, "budget": self.budget, "margins": self.margins, "bound": BOUND,
                "objective": "the target's mean paired loglik change from the backbone (nats per item)",
                "evaluated": len(self.results), "computed": computed, "replayed": len(self.results) - computed,
                "forward_passes": self.forwards, "candidates": [r.to_dict() for r in self.results],
                "front": [r.sha256 for r in self.front], "top": [r.sha256 for r in self.top],
                "plain_dose": plain}


def run(setup: Setup, *, budget: int, seed: int = 0, sampler: str = "auto", k: int = 3, progress=None,
        on_result=None, pool=None) -> Outcome:
    """Propose, build, score (or replay) and judge up to ``budget`` candidates; the front and the top ``k``.

    Args:
        setup (Setup): ``prepare``'s. budget (int): candidates. seed (int). sampler (str): auto, grid or tpe.
        k (int): how many to propose. progress: an iterable wrapper (tqdm). on_result: ``optimize.search``'s.
        pool (fanout.Pool | None): score on its Ray workers, ``len(pool)`` candidates at a time (None: here).
    """
    if k < 1:
        raise UsageError(f"--top {k}: propose at least 1 candidate")
    s, f, device = setup, setup.factors, setup.scorer.device

    def evaluate(params: dict):
        c = candidate(s.space, params)
        if c.problem:
            return judge(c, None, {}, {}, targets=s.targets, protect=s.protect, margins=s.margins,
                         trust_max=s.space.trust_max, computed=False)
        built = build(c, f, device=device)
        got = cached(s.ledger, s.sets, c.key, c.sha256)
        todo = [n for n in s.sets if n not in got]
        if todo:
            fresh = s.scorer.scores(built.updates, todo)
            record(s.ledger, s.sets, c.key, c.sha256, fresh)
            got.update(fresh)
        return judge(c, built, got, s.baseline, targets=s.targets, protect=s.protect, margins=s.margins,
                     trust_max=s.space.trust_max, computed=bool(todo))

    before, pool_before = s.scorer.forwards, pool.forwards() if pool is not None else 0
    results, used = search(s.space, evaluate, budget=budget, seed=seed, sampler=sampler, margins=s.margins,
                           progress=progress, on_result=on_result,
                           evaluate_many=evaluate_many(s, pool) if pool is not None else None,
                           parallel=len(pool) if pool is not None else 1)
    forwards = s.scorer.forwards - before + (pool.forwards() - pool_before if pool is not None else 0)
    return Outcome(search_id(s.space, seed, used), s.space, seed, used, budget, s.margins, results, front(results),
                   top(results, k), forwards, best_plain(results))
