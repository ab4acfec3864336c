"""Ranking new candidates by a proxy: only with a calibration that passed; otherwise flag the ones far below.

With a ``loo`` calibration whose verdict is "ranks candidates", candidates are ranked by their predicted target
(``Calibration.predict``), best first, with the held-out figures beside them. Otherwise they are listed as
given and a candidate is flagged "far below the others" when its modified z-score against the others
(Iglewicz and Hoaglin, 1993), the proxy oriented higher-is-better, is below ``-FAR_BELOW`` (3.5):

    M(x) = 0.6745 (x - med) / MAD,   MAD = median(|x_j - med|) over the others
    where MAD = 0:  M(x) = (x - med) / (1.253314 * MeanAD);  where both are 0: any value below is far below

Fewer than ``MIN_POOL`` (3) others flag nothing (said so). What the ranking says about its own resolution:
docs/design/evidence.md.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TypedDict

from .calibrate import Calibration

FAR_BELOW = 3.5
MIN_POOL = 3


def modified_z(x: float, others: Sequence[float]) -> float:
    """Iglewicz and Hoaglin's modified z-score of ``x`` against ``others`` (module docstring)."""
    med = statistics.median(others)
    dev = [abs(v - med) for v in others]
    mad = statistics.median(dev)
    if mad > 0:
        return 0.6745 * (x - med) / mad
    mean_ad = math.fsum(dev) / len(dev)
    if mean_ad > 0:
        return (x - med) / (1.253314 * mean_ad)
    return 0.0 if x == med else math.copysign(math.inf, x - med)


class CandidateRow(TypedDict):
    """One candidate of a ranking, as its JSON reads (``Ranking.rows``)."""

    candidate: str
    rank: int | None
    predicted: float | None
    extrapolated: list[str]
    proxies: dict[str, float]
    z: dict[str, float | None]
    far_below: list[str]


@dataclass(frozen=True)
class Ranking:
    """Candidates ranked by a calibrated prediction, or listed with disaster flags (``mode``).

    rows: one per candidate, in rank order (``ranking``) or as given (``detector``): ``{"candidate", "rank",
    "predicted", "extrapolated": [P... outside the past models' range], "proxies": {P: value}, "z": {P: M},
    "far_below": [P...]}``.
    """

    candidates: tuple[str, ...]
    proxies: tuple[str, ...]
    target: str | None
    mode: str
    verdict: str
    rows: tuple[CandidateRow, ...]
    calibration: dict | None
    reasons: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        return {"candidates": list(self.candidates), "proxies": list(self.proxies), "target": self.target,
                "mode": self.mode, "verdict": self.verdict, "rows": [dict(r) for r in self.rows],
                "calibration": self.calibration, "reasons": list(self.reasons)}


def rank_candidates(values: Mapping[str, Mapping[str, float]], *, history: Mapping[str, Mapping[str, float]],
                    calibration: Calibration | None = None,
                    directions: Mapping[str, bool] | None = None) -> Ranking:
    """Rank or flag the candidates (module docstring).

    Args:
        values (Mapping[str, Mapping[str, float]]): proxy -> candidate -> its mean (every candidate has every proxy;
            the first proxy's candidates, in order, are the candidates).
        history (Mapping[str, Mapping[str, float]]): proxy -> past model -> its mean (the others of the flags).
        calibration (Calibration | None): the proxies' held-out calibration against the target, if any.
        directions (Mapping[str, bool] | None): metric -> higher_is_better.
    """
    directions = directions or {}
    proxies = tuple(values)
    candidates = tuple(values[proxies[0]])
    reasons = []
    rows: list[CandidateRow] = []
    for c in candidates:
        z: dict[str, float | None] = {}
        far: list[str] = []
        for p in proxies:
            sign = -1.0 if directions.get(p) is False else 1.0
            others = [sign * v for k, v in values[p].items() if k != c]
            others += [sign * v for k, v in history.get(p, {}).items() if k not in values[p]]
            if len(others) < MIN_POOL:
                z[p] = None
                continue
            z[p] = score = modified_z(sign * values[p][c], others)
            if score < -FAR_BELOW:
                far.append(p)
        rows.append({"candidate": c, "rank": None, "predicted": None, "extrapolated": [],
                     "proxies": {p: values[p][c] for p in proxies}, "z": z, "far_below": far})
    if any(v is None for r in rows for v in r["z"].values()):
        reasons.append(f"fewer than {MIN_POOL} other models to compare with: no flags where z is -")
    target = calibration.target if calibration is not None else None
    if calibration is not None and calibration.ranks:
        higher = calibration.target_higher_is_better is not False
        spans = {p: (min(v), max(v)) for p, v in (calibration.proxy_means or {}).items()}
        predicted = {r["candidate"]: calibration.predict(r["proxies"]) for r in rows}
        for r in rows:
            r["predicted"] = predicted[r["candidate"]]
            r["extrapolated"] = [p for p in proxies if not spans[p][0] <= r["proxies"][p] <= spans[p][1]]
        out = [r["candidate"] for r in rows if r["extrapolated"]]
        if out:
            reasons.append(f"{', '.join(out)} lie outside the past models' range of the proxy: their predictions "
                           "extrapolate the fit")
        rows.sort(key=lambda r: -predicted[r["candidate"]] if higher else predicted[r["candidate"]])
        spread = predicted[rows[0]["candidate"]] - predicted[rows[-1]["candidate"]]
        if len(rows) > 1 and calibration.rmse is not None and abs(spread) < calibration.rmse:
            reasons.append(f"the candidates' predictions span {abs(spread):.3g}, less than the fit's held-out RMSE "
                           f"{calibration.rmse:.3g}: their order is finer than the proxy was shown to resolve")
        for i, r in enumerate(rows, 1):
            r["rank"] = i
        mode, verdict = "ranking", "ranks candidates"
    else:
        mode, verdict = "detector", "disaster detector only"
        if calibration is None:
            reasons.insert(0, "no --target: a proxy never calibrated against the target is at most a disaster detector")
        else:
            reasons.insert(0, f"the calibration against {target} says {calibration.verdict!r}")
            reasons += [f"calibration: {r}" for r in calibration.reasons]
    return Ranking(candidates, proxies, target, mode, verdict, tuple(rows),
                   None if calibration is None else calibration.to_dict(), tuple(reasons))
