"""The gate's thresholds: the ``gate:`` section of vecmerge.yaml (or a recipe's), every bad key reported at once."""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from .. import EvidenceError
from ..ledger.environment import EnvChoice


class GateConfigError(EvidenceError):
    """A ``gate:`` section with one or more bad keys or values (all listed in one line)."""


@dataclass(frozen=True)
class GateConfig:
    """Thresholds of the gate, from the ``gate:`` section of vecmerge.yaml; the defaults are documented.

    Args:
        metric (str | None): the metric for backbone and evidence (None: the caller's ``--metric``).
        min_repeats (int): runs the backbone needs (3: v54 was evaluated three times).
        max_backbone_sd (float | None): a set limit on the backbone's sample std; None: use the ledger.
        backbone_noise_factor (float): with no set limit, the backbone's std may be at most this many times
            the ledger's pooled within-model noise (1.0).
        min_evidence_runs (int): whole runs X and Y each need when the evidence rests on Welch (2).
        confidence (float): coverage of the intervals behind "beyond eval noise" (0.95).
        min_agree (float): share of modules that must agree with the consensus reference (1.0: v58 had 196/196).
        max_trust (float): largest relative step (0.015: v58's 0.0113 passes, v59's dose 45.6% larger,
            about 0.0165, does not).
        protect (str | tuple[str, ...] | None): the sub-scores that must not regress: ``all`` (the default,
            None, means all that X or Y recorded) or a list of names.
        margin (float | Mapping[str, float] | None): the non-inferiority margin, one value or one per
            sub-score; default (None, or a sub-score left out): one grade where the sub-score's recorded
            values lie on a grid, else its pooled within-model noise sd (``subscores.py``).
        env (str | Mapping[str, object] | tuple[str, ...] | None): the eval environment the evidence rows use: an
            id (as ``evidence show --by env`` prints it), fields (``{temperature: 0}``) or ``--env`` options
            (``[ID, KEY=VALUE]``); None: the one the records share.
        sources (Mapping[str, str]): where each value came from (``default`` or ``vecmerge.yaml gate.KEY``).
    """

    metric: str | None = None
    min_repeats: int = 3
    max_backbone_sd: float | None = None
    backbone_noise_factor: float = 1.0
    min_evidence_runs: int = 2
    confidence: float = 0.95
    min_agree: float = 1.0
    max_trust: float = 0.015
    protect: str | tuple[str, ...] | None = None
    margin: float | Mapping[str, float] | None = None
    env: str | Mapping[str, object] | tuple[str, ...] | None = None
    sources: Mapping[str, str] = field(default_factory=dict, compare=False)

    def source_of(self, key: str) -> str:
        return self.sources.get(key, "default")

    @classmethod
    def from_dict(cls, data: Mapping | None, source: str = "vecmerge.yaml") -> GateConfig:
        """A GateConfig from the ``gate:`` mapping; every bad key and value is reported at once.

        Raises:
            GateConfigError: one line, ``vecmerge.yaml gate: N problems: ...``.
        """
        if data is None:
            return cls()
        if not isinstance(data, Mapping):
            raise GateConfigError(f"{source} gate: expected a mapping of thresholds such as min_repeats: 3")
        known = [f.name for f in fields(cls) if f.name != "sources"]
        problems: list[str] = []
        values: dict[str, Any] = {}  # each value checked below against its field's type
        for key in data:
            if key not in known:
                problems.append(f"{key}: unknown key (use {', '.join(known)})")
        for key in known:
            if key not in data:
                continue
            v = data[key]
            real = isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v)
            if key == "metric":
                ok = v is None or (isinstance(v, str) and v.strip() == v and v != "")
                hint = "a metric name"
            elif key in ("min_repeats", "min_evidence_runs"):
                low = 1 if key == "min_repeats" else 2
                ok = isinstance(v, int) and not isinstance(v, bool) and v >= low
                hint = f"an integer >= {low}"
            elif key == "max_backbone_sd":
                ok = v is None or (real and v >= 0)
                hint = "a standard deviation >= 0, or null to use the ledger's noise"
            elif key == "backbone_noise_factor":
                ok, hint = real and v > 0, "a factor > 0"
            elif key == "confidence":
                ok, hint = real and 0 < v < 1, "between 0 and 1, e.g. 0.95"
            elif key == "min_agree":
                ok, hint = real and 0 <= v <= 1, "a share between 0 and 1"
            elif key == "protect":
                ok = v is None or v == "all" or (isinstance(v, list) and bool(v) and all(
                    isinstance(x, str) and x.strip() == x != "" for x in v))
                hint = "all, or a list of sub-score names such as [item_understanding, video]"
            elif key == "margin":
                ok = v is None or _positive(v) or (isinstance(v, Mapping) and bool(v) and all(
                    isinstance(k, str) and _positive(x) for k, x in v.items()))
                hint = "a difference > 0, or a mapping sub-score -> difference > 0"
            elif key == "env":
                try:
                    ok = v is None or (isinstance(v, (str, Mapping)) or (isinstance(v, list) and all(
                        isinstance(x, str) for x in v))) and bool(EnvChoice.parse(v, "gate.env"))
                except EvidenceError:
                    ok = False
                hint = "an environment id (evidence show --by env), or fields such as {temperature: 0}"
            else:  # max_trust
                ok, hint = real and v > 0, "a relative step > 0, e.g. 0.015"
            if ok and key == "env":
                values[key] = dict(v) if isinstance(v, Mapping) else tuple(v) if isinstance(v, list) else v
            elif ok and key in ("protect", "margin"):
                values[key] = (tuple(v) if isinstance(v, list) else dict(v) if isinstance(v, Mapping)
                               else v if v is None or isinstance(v, str) else float(v))
            elif ok:
                values[key] = v if key in ("metric", "min_repeats", "min_evidence_runs") or v is None else float(v)
            else:
                problems.append(f"{key}={v!r}: {hint}")
        if problems:
            head = problems[0] if len(problems) == 1 else f"{len(problems)} problems: " + "; ".join(problems)
            raise GateConfigError(f"{source} gate: {head}")
        return cls(**values, sources={k: f"{source} gate.{k}" for k in values})


def _positive(v: object) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v) and float(v) > 0
