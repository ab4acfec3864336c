"""What the ledger stores: an Entry to record, a Record read back, a pre-registered Plan, and the rule that
makes a record stale.

Evidence follows the weights, not the name: each record keeps the adapter's content sha256 at the time it
was recorded (see ``is_stale``).
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone

from .. import EvidenceError, difference
from .environment import Environment, canonical_fields

SHA_RE = re.compile(r"^[0-9a-f]{64}$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")  # NUL, escapes and the other control characters
MAX_PLAN_RUNS = 100_000  # a plan's most runs of each model (its looks are searched one run at a time)
PLAN_TESTS = difference.names(plan=True)  # the tests a plan may name: the registry's plan tests


def utc_now() -> str:
    """The current time as ``2026-05-01T12:00:00Z`` (UTC, seconds)."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def finite_number(value: object, what: str) -> float:
    """``float(value)`` for a real, finite number; raises EvidenceError naming ``what`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise EvidenceError(f"{what}: {value!r} is not a number")
    out = float(value)
    if not math.isfinite(out):
        raise EvidenceError(f"{what}: {value!r} is not finite (NaN and infinities cannot be recorded)")
    return out


def name_problem(value: object, what: str) -> str | None:
    """Why ``value`` cannot name a model, metric or key (None when it can): a non-empty string, no edge spaces,
    no NUL, line break or other control character (a name is shown on terminals and in CSV cells)."""
    if not isinstance(value, str) or not value.strip():
        return f"{what}: {value!r} must be a non-empty string"
    if value != value.strip() or "\n" in value:
        return f"{what}: {value!r} has surrounding spaces or a line break"
    found = _CONTROL.search(value)
    if found is not None:
        bad = found.group()
        return f"{what}: {value[:40]!r} holds control character 0x{ord(bad):02x} (NUL, escapes and the like: refused)"
    return None


@dataclass(frozen=True)
class Entry:
    """One evaluation to record; ``Ledger.write`` checks it and stores it with a time and an id.

    Args:
        model (str): the model's name (a workspace entry, a folder name).
        metric (str): what was measured, e.g. ``official_total`` or ``toy_mc/acc``.
        value (float): the score, finite.
        sha256 (str | None): the adapter's content sha256 (64 hex) when recorded; None when no adapter
            could be hashed (published scores of weights not on disk).
        subs (Mapping[str, float] | tuple): sub-scores, key -> finite float (kept as sorted pairs).
        stderr (float | None): a standard error the source reported with the value (lm-eval ``*_stderr``).
        item (str | None): the item (document) id for item-level records; None for a whole run.
        cluster (str | None): the item's cluster key (a passage, a topic), for clustered errors.
        source (str): where it came from: ``manual``, ``csv:FILE``, ``lm-eval:FILE``.
        note (str | None): free text.
        subscore (str | None): for an item-level record, the sub-score the item counts toward (its task);
            the item-level evidence of that sub-score. Whole runs carry their sub-scores in ``subs``.
        env (Mapping | tuple): the eval environment's fields (``environment.py``), kept as sorted canonical
            ``(key, text)`` pairs; empty: none recorded.
    """

    model: str
    metric: str
    value: float
    sha256: str | None = None
    subs: tuple[tuple[str, float], ...] = ()
    stderr: float | None = None
    item: str | None = None
    cluster: str | None = None
    source: str = "manual"
    note: str | None = None
    subscore: str | None = None
    env: tuple[tuple[str, str], ...] = ()

    def __post_init__(self):
        if isinstance(self.subs, Mapping):
            object.__setattr__(self, "subs", tuple(sorted(self.subs.items())))
        if isinstance(self.env, Mapping):  # raises EvidenceError naming the field for a bad one
            object.__setattr__(self, "env", canonical_fields(self.env))
        if isinstance(self.item, int) and not isinstance(self.item, bool):
            object.__setattr__(self, "item", str(self.item))

    def problems(self) -> list[str]:
        """Every problem with this entry, one short phrase each (empty when it can be recorded)."""
        out = [p for p in (name_problem(self.model, "model"), name_problem(self.metric, "metric"),
                           name_problem(self.source, "source")) if p]
        if self.sha256 is not None and not (isinstance(self.sha256, str) and SHA_RE.match(self.sha256)):
            out.append(f"sha256: {self.sha256!r} is not 64 lowercase hex digits")
        for what, value in [("value", self.value), ("stderr", self.stderr)] + [
                (f"sub.{k}", v) for k, v in self.subs]:
            if value is None and what == "stderr":
                continue
            try:
                finite_number(value, what)
            except EvidenceError as err:
                out.append(str(err))
        out += [p for k, _ in self.subs if (p := name_problem(k, "sub-score key"))]
        for what in ("item", "cluster", "subscore"):
            value = getattr(self, what)
            if value is not None and (p := name_problem(value, what)):
                out.append(p)
        if self.cluster is not None and self.item is None:
            out.append("cluster: only item-level records (with an item id) carry a cluster key")
        if self.subscore is not None and self.item is None:
            out.append("subscore: only item-level records name the sub-score they count toward; a run's "
                       "sub-scores are its subs (sub.KEY)")
        if self.stderr is not None and isinstance(self.stderr, numbers.Real) and self.stderr < 0:
            out.append(f"stderr: {self.stderr!r} is negative")
        try:
            if canonical_fields(self.env) != tuple(self.env):
                out.append(f"env: {self.env!r} is not in canonical form (use environment.canonical_fields)")
        except EvidenceError as err:
            out.append(str(err))
        return out

    @property
    def environment(self) -> Environment:
        return Environment(tuple(self.env))


@dataclass(frozen=True)
class Record:
    """A stored evaluation: an Entry with its id and UTC time, and whether it is stale for this query.

    ``stale`` is True when the caller passed the model's current sha256 and this record measured other
    weights (or weights that were never hashed).
    """

    id: int
    model: str
    sha256: str | None
    metric: str
    value: float
    subs: tuple[tuple[str, float], ...] = ()
    stderr: float | None = None
    item: str | None = None
    cluster: str | None = None
    source: str = "manual"
    note: str | None = None
    created: str = ""
    subscore: str | None = None
    env: tuple[tuple[str, str], ...] = ()
    stale: bool = field(default=False, compare=False)

    @property
    def sub_scores(self) -> dict[str, float]:
        return dict(self.subs)

    @property
    def environment(self) -> Environment:
        """The eval environment the record was measured under (``environment.py``)."""
        return Environment(self.env)

    @property
    def is_item(self) -> bool:
        """True for an item-level record (one document), False for a whole run."""
        return self.item is not None

    def to_dict(self) -> dict:
        """A flat JSON-ready dict: the columns, ``env_id``, then ``sub.KEY`` for each sub-score and ``env.KEY``
        for each environment field."""
        out = {"id": self.id, "model": self.model, "sha256": self.sha256, "metric": self.metric,
               "value": self.value, "stderr": self.stderr, "item": self.item, "cluster": self.cluster,
               "source": self.source, "note": self.note, "created": self.created, "stale": self.stale,
               "subscore": self.subscore, "env_id": self.environment.id}
        out.update({f"sub.{k}": v for k, v in self.subs})
        out.update({f"env.{k}": v for k, v in self.env})
        return out


def is_stale(record: Record, current_sha: Mapping[str, str | None] | None) -> bool:
    """Whether ``record`` measured other weights than the model's current ones.

    Rule: with no ``current_sha`` nothing is stale. For a model named in it with a hash, a record is
    current only if its sha256 equals that hash (a record without a hash is stale: it cannot be tied to
    these weights). A model absent from ``current_sha`` or mapped to None has nothing to compare
    against, so its records are not stale.
    """
    if not current_sha:
        return False
    now = current_sha.get(record.model)
    return now is not None and record.sha256 != now


@dataclass(frozen=True)
class Plan:
    """A pre-registered sequential comparison of A against B on one metric (immutable once recorded).

    The runs of A and B on ``metric`` recorded after it (record ids above ``after_record``, of the weights the
    plan names) are its looks; ``sequential.decide`` judges them.

    Args:
        id (int): the plan's id (0 before it is recorded).
        a, b (str): the models: is A better than B?
        metric (str): the metric compared.
        a_sha256, b_sha256 (str | None): the adapters' content sha256 when the plan was made (None: not an
            adapter here, like a published score).
        min_effect (float): D > 0, the smallest difference worth finding, in the metric's units and direction.
        max_runs (int): the most runs of each model the plan spends (>= 2).
        alpha (float): the error rate (two-sided: better or worse) at the plan's looks, 0 < alpha < 1.
        higher_is_better (bool): the metric's direction when the plan was made.
        noise_sd (float | None): the ledger's pooled within-model noise on the metric at that time.
        prior_scale (float): the sd of the test's prior on the standardized effect (A - B) / sigma:
            ``min_effect / noise_sd``, or 1 without a noise estimate.
        test (str): ``group-sequential`` (planned looks, ``planned.py``) or ``t-mixture`` (anytime-valid,
            ``sequential.py``); any other name is refused (``PLAN_TESTS``).
        after_record (int): the largest record id when the plan was made.
        created (str): UTC time.
        design (dict | None): the planned looks' design and the power stated when the plan was made
            (``planned.Design`` fields, ``power``); None for a t-mixture plan or one older than schema 4.
        chain (str | None): the integrity record, sha256 chained over the plan rows (``plan_chain.py``); None
            only for plans recorded before schema 4.
    """

    id: int
    a: str
    b: str
    metric: str
    a_sha256: str | None
    b_sha256: str | None
    min_effect: float
    max_runs: int
    alpha: float
    higher_is_better: bool
    noise_sd: float | None
    prior_scale: float
    test: str
    after_record: int = 0
    created: str = ""
    design: dict | None = None
    chain: str | None = None

    def problems(self) -> list[str]:
        """Every problem with this plan, one short phrase each (empty when it can be recorded)."""
        out = [p for p in (name_problem(self.a, "model A"), name_problem(self.b, "model B"),
                           name_problem(self.metric, "metric"), name_problem(self.test, "test")) if p]
        if not out and self.a == self.b:
            out.append(f"--vs {self.b}: a model cannot be planned against itself")
        if not out and self.test not in PLAN_TESTS:
            out.append(f"test: {self.test!r} is not a test vecmerge knows ({', '.join(PLAN_TESTS)})")
        if self.design is not None and not isinstance(self.design, dict):
            out.append(f"design: {self.design!r} is not a JSON object")
        for what in ("a_sha256", "b_sha256"):
            value = getattr(self, what)
            if value is not None and not (isinstance(value, str) and SHA_RE.match(value)):
                out.append(f"{what}: {value!r} is not 64 lowercase hex digits")
        checks = [("min_effect", self.min_effect, lambda v: v > 0, "a difference > 0"),
                  ("alpha", self.alpha, lambda v: 0 < v < 1, "between 0 and 1, e.g. 0.05"),
                  ("prior_scale", self.prior_scale, lambda v: v > 0, "> 0")]
        if self.noise_sd is not None:
            checks.append(("noise_sd", self.noise_sd, lambda v: v >= 0, ">= 0"))
        for what, value, good, hint in checks:
            try:
                if not good(finite_number(value, what)):
                    out.append(f"{what}: {value!r} must be {hint}")
            except EvidenceError as err:
                out.append(str(err))
        if isinstance(self.max_runs, bool) or not isinstance(self.max_runs, int) or self.max_runs < 2:
            out.append(f"max_runs: {self.max_runs!r} must be an integer >= 2 (a look needs two runs of each)")
        elif self.max_runs > MAX_PLAN_RUNS:
            out.append(f"max_runs: {self.max_runs} must be at most {MAX_PLAN_RUNS} runs of each model")
        if not isinstance(self.higher_is_better, bool):
            out.append(f"higher_is_better: {self.higher_is_better!r} must be true or false")
        return out

    def to_dict(self) -> dict:
        """The plan's fields as a JSON-ready dict."""
        return dict(self.__dict__)
