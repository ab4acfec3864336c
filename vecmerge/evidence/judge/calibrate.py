"""Proxy calibration: can a cheap local metric P rank candidates the way the target metric T does?

Over the models that have both P and T (each model's mean over its current runs): Spearman ρ
(``scipy.stats.spearmanr``; a perfect order without ties gets the exact p 2 / n!), Kendall τ_b, percentile
bootstrap intervals over ``n_boot`` seeded resamples of the models, pairwise accuracy (P ties count 1/2) and
the noise ceiling (the mean ρ between one run per model and the mean of its other runs).

Verdict: "too few models" below ``min_models`` (8); "ranks candidates" when the lower end of ρ's interval
>= ``min_spearman_low`` (0.5); otherwise "disaster detector only". ``Calibration`` is the one result type of
this and of ``loo``. The user's lesson behind the thresholds: docs/design/evidence.md.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from .. import EvidenceError
from ..ledger.ledger import Record
from ..stats.stats import runs_by_model

MIN_MODELS = 8
MIN_SPEARMAN_LOW = 0.5
VERDICTS = {"ranks_candidates": "ranks candidates", "disaster_detector_only": "disaster detector only",
            "too_few_models": "too few models"}


def _rank_rows(x: np.ndarray) -> np.ndarray:
    from scipy.stats import rankdata

    return rankdata(x, axis=-1)


def _pearson_rows(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Row-wise Pearson r of (B, n) arrays; NaN where a row is constant."""
    xc = x - x.mean(axis=-1, keepdims=True)
    yc = y - y.mean(axis=-1, keepdims=True)
    den = np.sqrt((xc * xc).sum(-1) * (yc * yc).sum(-1))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, (xc * yc).sum(-1) / np.where(den > 0, den, 1.0), np.nan)


def spearman_rows(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Row-wise Spearman ρ (Pearson r of average ranks) of (B, n) arrays; NaN for a constant row."""
    return _pearson_rows(_rank_rows(x), _rank_rows(y))


def kendall_rows(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Row-wise Kendall τ_b = Σ_{i<j} sgn(x_i-x_j)·sgn(y_i-y_j) / sqrt((n0-n1)(n0-n2)); NaN if a row is constant.

    n0 = n(n-1)/2 pairs, n1 / n2 the pairs tied in x / in y.
    """
    n = x.shape[-1]
    iu = np.triu_indices(n, 1)
    sx = np.sign(x[..., :, None] - x[..., None, :])[..., iu[0], iu[1]]
    sy = np.sign(y[..., :, None] - y[..., None, :])[..., iu[0], iu[1]]
    n0 = n * (n - 1) / 2
    den = np.sqrt((n0 - (sx == 0).sum(-1)) * (n0 - (sy == 0).sum(-1)))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, (sx * sy).sum(-1) / np.where(den > 0, den, 1.0), np.nan)


def pairwise_accuracy(proxy: Sequence[float], target: Sequence[float]) -> tuple[float | None, int]:
    """Share of model pairs with different target values that the proxy orders the same way (ties 1/2).

    Returns (accuracy or None when no pair differs in the target, number of such pairs).
    """
    agree, pairs = 0.0, 0
    for i in range(len(target)):
        for j in range(i + 1, len(target)):
            dt = target[i] - target[j]
            if dt == 0:
                continue
            pairs += 1
            dp = proxy[i] - proxy[j]
            agree += 0.5 if dp == 0 else float((dp > 0) == (dt > 0))
    return (agree / pairs if pairs else None), pairs


def noise_ceiling(target_runs: Mapping[str, Sequence[float]], *, draws: int = 2000,
                  seed: int = 0) -> tuple[float | None, int]:
    """Mean Spearman ρ between one target run per model and the mean of that model's other runs.

    Args:
        target_runs (Mapping[str, Sequence[float]]): model -> its target runs (models with < 2 are left out).
        draws (int): enumerate every choice of one run per model when there are at most this many, else
            sample this many choices (seeded).

    Returns:
        (ceiling or None when fewer than 3 models have 2 runs, the number of models used).
    """
    runs = [np.asarray(v, dtype=float) for v in target_runs.values() if len(v) >= 2]
    m = len(runs)
    if m < 3:
        return None, m
    sizes = [len(r) for r in runs]
    if math.prod(sizes) <= draws:
        choice = np.array(np.meshgrid(*[np.arange(k) for k in sizes], indexing="ij")).reshape(m, -1).T
    else:
        rng = np.random.default_rng(seed)
        choice = np.stack([rng.integers(0, k, draws) for k in sizes], axis=1)
    single = np.stack([r[choice[:, i]] for i, r in enumerate(runs)], axis=1)
    rest = np.stack([(r.sum() - r[choice[:, i]]) / (len(r) - 1) for i, r in enumerate(runs)], axis=1)
    rho = spearman_rows(single, rest)
    rho = rho[~np.isnan(rho)]
    return (float(rho.mean()) if rho.size else None), m


def rank_agreement(p: np.ndarray, t: np.ndarray, *, n_boot: int, seed: int, confidence: float) -> tuple:
    """Spearman ρ and Kendall τ_b of ``p`` against ``t`` (scipy, with p-values) and their bootstrap intervals.

    The interval is the percentile interval over ``n_boot`` resamples of the n pairs with replacement (seeded);
    resamples where either side is constant are skipped and counted out of ``valid``.

    Returns:
        (rho, rho_p, rho_ci, tau, tau_p, tau_ci, valid): all None (and valid 0) with fewer than 3 pairs or a
        constant side.
    """
    n = len(t)
    if n < 3 or not (np.ptp(p) > 0 and np.ptp(t) > 0):
        return None, None, None, None, None, None, 0
    from scipy import stats

    rho, rho_p = (float(v) for v in stats.spearmanr(p, t))
    tau, tau_p = (float(v) for v in stats.kendalltau(p, t))
    if abs(rho) > 1 - 1e-12 and len(set(p.tolist())) == n and len(set(t.tolist())) == n:
        # a perfect rank order: 2 of the n! equally likely orders under no association (scipy's t approximation
        # gives about 1e-24 for n = 5, printed "p 0")
        rho, rho_p = math.copysign(1.0, rho), min(1.0, 2 / math.factorial(n))
    idx = np.random.default_rng(seed).integers(0, n, (n_boot, n))
    bp, bt = p[idx], t[idx]
    brho, btau = spearman_rows(bp, bt), kendall_rows(bp, bt)
    ok = ~(np.isnan(brho) | np.isnan(btau))
    valid = int(ok.sum())
    rho_ci = tau_ci = None
    if valid:
        q = [(1 - confidence) / 2, (1 + confidence) / 2]
        rho_ci = tuple(float(v) for v in np.quantile(brho[ok], q))
        tau_ci = tuple(float(v) for v in np.quantile(btau[ok], q))
    return rho, rho_p, rho_ci, tau, tau_p, tau_ci, valid


def orientation_flip(proxy_higher_is_better: bool | None, target_higher_is_better: bool | None) -> bool:
    """Whether the proxy is negated before it is compared with the target: only when both directions are declared
    and differ. An undeclared direction takes the other's, so an undeclared proxy of a lower-is-better target is
    read as lower-is-better too (never flipped into looking like the target's opposite)."""
    return (proxy_higher_is_better is not None and target_higher_is_better is not None
            and proxy_higher_is_better != target_higher_is_better)


def verdict(n: int, need: int, rho: float | None, rho_ci: tuple[float, float] | None, ceiling: float | None, *,
            min_spearman_low: float, target: str, have: str, rho_name: str, negative: str,
            reasons: Sequence[str] = ()) -> tuple[str, tuple[str, ...]]:
    """The verdict code and every reason (``reasons`` found before, then the rule's), for both calibrations:

        too_few_models  n < need          ranks_candidates  rho_ci[0] >= min_spearman_low
        disaster_detector_only  otherwise (plus a reason for ρ < 0 and for a noise ceiling < min_spearman_low)

    Args:
        n (int): the models compared. need (int): the fewest that may be judged. rho (float | None): Spearman's ρ.
        rho_ci (tuple[float, float] | None): its interval. ceiling (float | None): the target's noise ceiling.
        min_spearman_low (float): the bound. target (str): the target's name. have (str): what the n models have.
        rho_name (str): ρ's name in the bound's reason. negative (str): the reason for ρ < 0.
        reasons (Sequence[str]): the reasons found before.
    """
    out = list(reasons)
    if n < need:
        code = "too_few_models"
        out.insert(0, f"{n} models have {have}; at least {need} are needed")
    elif rho_ci is not None and rho_ci[0] >= min_spearman_low:
        code = "ranks_candidates"
    else:
        code = "disaster_detector_only"
        if rho_ci is not None:
            out.append(f"{rho_name} lower bound {rho_ci[0]:.3f} < {min_spearman_low}")
    if rho is not None and rho < 0:
        out.append(negative)
    if ceiling is not None and ceiling < min_spearman_low:
        out.append(f"one run of {target} ranks the models only to ρ = {ceiling:.3f}: the target itself is noisy")
    return code, tuple(out)


# The fields only one kind of calibration has: a single proxy's, and the held-out fit's (``loo.py``).
_ONE_PROXY = ("proxy", "flipped")
_HELD_OUT = ("proxies", "target_means", "proxy_means", "predictions", "coefficients", "rmse",
             "target_higher_is_better", "loo")


@dataclass(frozen=True, kw_only=True)
class Calibration:
    """How well proxies rank the models that target T ranks, and the verdict (figures: the module docstrings).

    One type for both calibrations: ``calibrate`` (one proxy, ``proxy`` and ``flipped`` set) and
    ``loo.calibrate_loo`` (held-out predictions of a fit on several proxies: ``proxies``, the fit and ``loo``
    set). ``to_dict`` writes the fields of its kind, in this order (held out: plus ``held_out``, per model).
    """

    proxy: str | None = None
    proxies: tuple[str, ...] | None = None
    target: str
    models: tuple[str, ...]
    target_means: tuple[float, ...] | None = None
    proxy_means: dict | None = None
    predictions: tuple[float, ...] | None = None
    coefficients: dict | None = None
    spearman: float | None
    spearman_p: float | None
    spearman_ci: tuple[float, float] | None
    kendall: float | None
    kendall_p: float | None
    kendall_ci: tuple[float, float] | None
    boot_valid: int
    pairwise_accuracy: float | None
    pairs: int
    rmse: float | None = None
    noise_ceiling: float | None
    noise_ceiling_models: int
    flipped: bool = False
    target_higher_is_better: bool | None = None
    min_models: int
    min_spearman_low: float
    confidence: float
    n_boot: int
    seed: int
    verdict_code: str
    verdict: str
    reasons: tuple[str, ...] = ()
    loo: bool = False

    @property
    def ranks(self) -> bool:
        return self.verdict_code == "ranks_candidates"

    def predict(self, values: Mapping[str, float]) -> float:
        """The held-out kind's full fit: its prediction of the target from ``values`` (proxy -> a model's mean).

        Raises EvidenceError for a one-proxy calibration (it fits nothing)."""
        c = self.coefficients
        if c is None or self.proxies is None:
            raise EvidenceError(f"calibration of {self.proxy} against {self.target} fits no prediction; use --loo")
        return c["intercept"] + math.fsum(c[p] * values[p] for p in self.proxies)

    def to_dict(self) -> dict:
        out = asdict(self)
        for key in _ONE_PROXY if self.loo else _HELD_OUT:
            del out[key]
        for key in ("proxies", "models", "target_means", "predictions", "spearman_ci", "kendall_ci", "reasons"):
            if key in out:
                out[key] = None if out[key] is None else list(out[key])
        if self.loo:
            proxy_means = self.proxy_means or {}
            out["held_out"] = [{"model": m, "target": t, "predicted": None if self.predictions is None else p,
                                **{f"proxy:{k}": proxy_means[k][i] for k in self.proxies or ()}}
                               for i, (m, t, p) in enumerate(zip(self.models, self.target_means or (),
                                                                 self.predictions or [None] * len(self.models)))]
        return out


def calibrate(proxy: Mapping[str, Sequence[float]], target: Mapping[str, Sequence[float]], *,
              proxy_name: str = "proxy", target_name: str = "target", proxy_higher_is_better: bool | None = True,
              target_higher_is_better: bool | None = True, min_models: int = MIN_MODELS,
              min_spearman_low: float = MIN_SPEARMAN_LOW, confidence: float = 0.95, n_boot: int = 2000,
              seed: int = 0, ceiling_draws: int = 2000) -> Calibration:
    """Calibrate proxy P against target T over the models that have both (verdict rule: module docstring).

    Args:
        proxy, target (Mapping[str, Sequence[float]]): model -> its runs on P / on T.
        proxy_higher_is_better, target_higher_is_better (bool | None): the metrics' directions; when both are
            declared and differ the proxy is negated first (``flipped``) so that ρ > 0 means "P orders models as T
            does"; an undeclared one (None) takes the other's (``orientation_flip``).
        min_models (int): fewer models with both metrics give "too few models" (the user's 8).
        min_spearman_low (float): the lower bootstrap bound of ρ a proxy needs to "rank candidates".
        n_boot (int), seed (int): bootstrap resamples over models and their seed.
    """
    if min_models < 3:
        raise EvidenceError(f"min_models={min_models}: at least 3 models are needed for a rank correlation")
    models = tuple(m for m in target if proxy.get(m) and target.get(m))
    flip = orientation_flip(proxy_higher_is_better, target_higher_is_better)
    p = np.array([math.fsum(proxy[m]) / len(proxy[m]) for m in models]) * (-1.0 if flip else 1.0)
    t = np.array([math.fsum(target[m]) / len(target[m]) for m in models])
    n = len(models)
    ceiling, ceiling_models = noise_ceiling({m: target[m] for m in models}, draws=ceiling_draws, seed=seed)
    acc, pairs = pairwise_accuracy(list(p), list(t)) if n >= 2 else (None, 0)
    reasons = []
    rho, rho_p, rho_ci, tau, tau_p, tau_ci, valid = rank_agreement(p, t, n_boot=n_boot, seed=seed,
                                                                  confidence=confidence)
    if n >= 3 and rho is None:
        reasons.append(f"{proxy_name if np.ptp(p) == 0 else target_name} is the same for every model")
    code, why = verdict(n, min_models, rho, rho_ci, ceiling, min_spearman_low=min_spearman_low, target=target_name,
                        have=f"both {proxy_name} and {target_name}", rho_name="Spearman's",
                        negative="the correlation is negative: check both metrics' directions", reasons=reasons)
    return Calibration(proxy=proxy_name, target=target_name, models=models, spearman=rho, spearman_p=rho_p,
                       spearman_ci=rho_ci, kendall=tau, kendall_p=tau_p, kendall_ci=tau_ci, boot_valid=valid,
                       pairwise_accuracy=acc, pairs=pairs, noise_ceiling=ceiling, noise_ceiling_models=ceiling_models,
                       flipped=flip, min_models=min_models, min_spearman_low=min_spearman_low, confidence=confidence,
                       n_boot=n_boot, seed=seed, verdict_code=code, verdict=VERDICTS[code], reasons=why)


def calibrate_records(records: Iterable[Record], proxy: str, target: str, *,
                      directions: Mapping[str, bool] | None = None, **options: Any) -> Calibration:
    """``calibrate`` over ledger records: each model's whole runs on ``proxy`` and on ``target``.

    Args:
        records (Iterable[Record]): current records (stale ones left out), any metrics.
        proxy, target (str): the two metric names.
        directions (Mapping[str, bool] | None): ``Ledger.directions()``.
        options: passed to ``calibrate`` (min_models, min_spearman_low, confidence, n_boot, seed, ...).
    """
    records = list(records)
    directions = directions or {}
    by = {m: runs_by_model(r for r in records if r.metric == m) for m in (proxy, target)}
    return calibrate(by[proxy], by[target], proxy_name=proxy, target_name=target,
                     proxy_higher_is_better=directions.get(proxy), target_higher_is_better=directions.get(target),
                     **options)
