"""Group-sequential boundaries: crossing probabilities over K looks and alpha (or beta) spending.

Canonical joint distribution (Jennison and Turnbull 2000, ch. 3): Z_k = S_k / sqrt(I_k), independent
increments S_k - S_{k-1} ~ N(θ Δ_k, Δ_k), Δ_k = I_k - I_{k-1}. The Armitage-McPherson-Rowe recursion on the
density of Z_k over the continuation region, by Simpson's rule on ``GRID`` points:

    P(continue to k, Z_k >= b) = ∫ f_{k-1}(y) Φ̄((b sqrt(I_k) - y sqrt(I_{k-1}) - θ Δ_k) / sqrt(Δ_k)) dy
    obf     a(t) = 2 - 2 Φ(z_{a/2} / sqrt(t))        pocock  a(t) = a log(1 + (e - 1) t)

Look k spends a(t_k) - a(t_{k-1}) beyond its boundary; a(1) = a. Sources and what the tests pin it
against: docs/design/evidence.md.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy import optimize, special, stats

from .. import EvidenceError

SPENDING = ("obf", "pocock")
GRID = 401  # Simpson points per look (odd); the density is smooth: error below 1e-7 at the tables' values
_WIDTH = 9.0  # the grid spans the mean ± 9 sd where no boundary cuts it
_HUGE = 40.0  # a boundary beyond this z spends nothing a double can hold


def spent(fraction: float, level: float, family: str = "obf") -> float:
    """a(t), the error spent by information fraction t (module docstring).

    Args:
        fraction (float): t in [0, 1]. level (float): a, one-sided. family (str): ``obf`` or ``pocock``.
    """
    if family not in SPENDING:
        raise EvidenceError(f"spending {family!r}: one of {', '.join(SPENDING)}")
    t = min(max(fraction, 0.0), 1.0)
    if t == 0.0:
        return 0.0
    if family == "obf":
        return float(2.0 * stats.norm.sf(stats.norm.isf(level / 2.0) / math.sqrt(t)))
    return float(level * math.log1p((math.e - 1.0) * t))


def _simpson(lo: float, hi: float) -> tuple[np.ndarray, np.ndarray]:
    """Points and Simpson weights on [lo, hi]."""
    z = np.linspace(lo, hi, GRID)
    w = np.ones(GRID)
    w[1:-1:2], w[2:-1:2] = 4.0, 2.0
    return z, w * (hi - lo) / (3.0 * (GRID - 1))


class _Walk:
    """The density of Z_k on the continuation region, look by look, under drift θ."""

    def __init__(self, theta: float):
        self.theta, self.info = theta, 0.0
        self.z: np.ndarray | None = None
        self.wf: np.ndarray | None = None  # Simpson weight x density

    def tail(self, info: float, bound: float, upper: bool) -> float:
        """P(continue to this look, Z >= bound) (upper) or Z <= bound (lower)."""
        if math.isinf(bound):
            return 0.0 if (bound > 0) == upper else self.mass(info)
        dk = info - self.info
        if self.z is None or self.wf is None:  # first look (both None until ``step``): Z ~ N(θ sqrt(I), 1)
            x = bound - self.theta * math.sqrt(info)
            return float(stats.norm.sf(x) if upper else stats.norm.cdf(x))
        xs = (bound * math.sqrt(info) - self.z * math.sqrt(self.info) - self.theta * dk) / math.sqrt(dk)
        return float(self.wf @ (special.ndtr(-xs) if upper else special.ndtr(xs)))

    def mass(self, info: float) -> float:
        return 1.0 if self.z is None or self.wf is None else float(self.wf.sum())

    def step(self, info: float, lo: float, hi: float) -> None:
        """Move to the next look and keep Z's density on (lo, hi)."""
        mean = self.theta * math.sqrt(info)
        lo, hi = max(lo, mean - _WIDTH), min(hi, mean + _WIDTH)
        if not lo < hi:
            self.z, self.wf, self.info = np.array([0.0]), np.array([0.0]), info
            return
        z, w = _simpson(lo, hi)
        if self.z is None:
            dens = stats.norm.pdf(z - mean)
        else:
            dk = info - self.info
            x = (z[:, None] * math.sqrt(info) - self.z[None, :] * math.sqrt(self.info) - self.theta * dk)
            x /= math.sqrt(dk)
            dens = (np.exp(-0.5 * x * x) @ self.wf) * math.sqrt(info / dk) / math.sqrt(2 * math.pi)
        self.z, self.wf, self.info = z, w * dens, info


def crossing(info: Sequence[float], lower: Sequence[float], upper: Sequence[float],
             theta: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """P(first exit at look k above ``upper[k]``) and (below ``lower[k]``), continuation lower < Z < upper.

    Args:
        info (Sequence[float]): I_1 < ... < I_K (any scale with θ on its inverse square root).
        lower, upper (Sequence[float]): K boundaries each (±inf: none).
        theta (float): the drift; Z_k has mean θ sqrt(I_k).
    """
    walk, up, down = _Walk(theta), [], []
    for i, lo, hi in zip(info, lower, upper):
        up.append(walk.tail(i, hi, True))
        down.append(walk.tail(i, lo, False))
        walk.step(i, lo, hi)
    return np.array(up), np.array(down)


class Spending:
    """One-sided upper boundaries b_k, look by look, that spend a(t_k) - a(t_{k-1}) under θ = 0 (no lower
    boundary: non-binding). A boundary depends only on the looks before it, so looks are added as they happen.

    Args:
        level (float): a, one-sided (0 < a < 1). family (str): ``obf`` or ``pocock``.
    """

    def __init__(self, level: float, family: str = "obf"):
        if not 0 < level < 1:
            raise EvidenceError(f"spending level {level!r}: between 0 and 1")
        spent(1.0, level, family)  # checks the family
        self.level, self.family = level, family
        self.fractions: list[float] = []
        self.bounds: list[float] = []
        self._walk, self._before = _Walk(0.0), 0.0

    def add(self, fraction: float) -> float:
        """The boundary at a look at information fraction t (after every earlier one; t = 1 spends the rest).

        Returns:
            float: b_k on the z scale (``inf`` where the look spends nothing a double holds).
        """
        if not 0 < fraction <= 1 or (self.fractions and fraction <= self.fractions[-1]):
            raise EvidenceError(f"information fraction {fraction!r} after {self.fractions[-1:]!r}: increasing, "
                                "in (0, 1]")
        now = spent(fraction, self.level, self.family)
        spend, self._before, walk = now - self._before, now, self._walk
        if spend <= 1e-300 or walk.tail(fraction, _HUGE, True) >= spend:
            b = math.inf
        else:
            b = float(optimize.brentq(lambda x: walk.tail(fraction, x, True) - spend, -_HUGE, _HUGE, xtol=1e-10))
        walk.step(fraction, -math.inf, b)
        self.fractions.append(fraction)
        self.bounds.append(b)
        return b


    def copy(self) -> Spending:
        """An independent copy (the walk's arrays are never changed in place, so they are shared)."""
        out = Spending.__new__(Spending)
        out.level, out.family, out.fractions, out.bounds = self.level, self.family, list(self.fractions), list(
            self.bounds)
        walk = _Walk(0.0)
        walk.info, walk.z, walk.wf = self._walk.info, self._walk.z, self._walk.wf
        out._walk, out._before = walk, self._before
        return out


_MEMO: dict[tuple, Spending] = {}
_MEMO_SIZE = 20_000


def boundary(level: float, family: str, fractions: tuple[float, ...]) -> float:
    """The boundary at the last of ``fractions`` (``Spending(level, family)`` after each of them), remembered by
    its prefix: the same looks (every plan of one schedule, every simulation) cost one computation."""
    key = (level, family, fractions)
    if key not in _MEMO:
        if len(_MEMO) > _MEMO_SIZE:
            _MEMO.clear()
        k = len(fractions) - 1
        while k > 0 and (level, family, fractions[:k]) not in _MEMO:
            k -= 1
        sp = _MEMO[(level, family, fractions[:k])].copy() if k else Spending(level, family)
        for j in range(k, len(fractions)):
            sp.add(fractions[j])
            _MEMO[(level, family, fractions[:j + 1])] = sp
            sp = sp.copy()
    return _MEMO[key].bounds[-1]


def spending_bounds(fractions: Sequence[float], level: float, family: str = "obf") -> list[float]:
    """``Spending(level, family)`` boundaries at every fraction in turn (0 < t_1 < ... < t_K <= 1)."""
    sp = Spending(level, family)
    return [sp.add(t) for t in fractions]


def constant_bounds(looks: int, alpha: float, shape: str) -> float:
    """The constant C of the classical two-sided tests at K equally spaced looks, |Z_k| >= C w_k:
    Pocock (w_k = 1) and O'Brien-Fleming (w_k = sqrt(K / k)), total level alpha under θ = 0.

    Args:
        looks (int): K. alpha (float): two-sided level. shape (str): ``pocock`` or ``obf``.
    """
    info = [k / looks for k in range(1, looks + 1)]
    weight = [1.0 if shape == "pocock" else math.sqrt(looks / k) for k in range(1, looks + 1)]

    def level(c: float) -> float:
        up, down = crossing(info, [-c * w for w in weight], [c * w for w in weight])
        return float(up.sum() + down.sum()) - alpha

    return float(optimize.brentq(level, 1.0, 6.0, xtol=1e-10))
