"""Rank policy: turn any module update back into LoRA factors of a chosen rank.

Policies (``RankPolicy.parse``):

- ``exact``: the smallest rank whose cut error is below ``EXACT_RTOL`` (1e-9) of the update's norm,
  i.e. only float64 round-off is dropped: the written update equals the intended one to the
  output dtype's precision.
- ``N`` (an integer): the best rank-N approximation (Eckart-Young), never above the exact rank.
- ``energy:E``: the smallest rank keeping a share ``E`` of ``||update||^2``.

The error of a cut is ``sqrt(sum of dropped S_i^2)``, exactly, from the SVD of the small core.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import RecipeError
from .lowrank import SVD, LowRank


@dataclass(frozen=True)
class RankPolicy:
    """How many singular directions each written module keeps.

    Args:
        kind (str): ``exact``, ``fixed`` or ``energy``.
        value (float): the rank for ``fixed``, the energy share for ``energy``.
    """

    kind: str = "exact"
    value: float = 0.0

    @classmethod
    def parse(cls, text) -> RankPolicy:
        """``exact`` | ``N`` | ``energy:E`` (0 < E <= 1)."""
        s = str(text).strip().lower()
        if s == "exact":
            return cls("exact")
        if s.isdigit() and int(s) >= 1:
            return cls("fixed", int(s))
        if s.startswith("energy:"):
            try:
                e = float(s.split(":", 1)[1])
            except ValueError:
                e = -1.0
            if 0.0 < e <= 1.0:
                return cls("energy", e)
        raise RecipeError([f"rank={text!r}: use 'exact', a positive integer, or 'energy:E' with 0 < E <= 1"])

    def choose(self, s: SVD) -> tuple[int, int]:
        """(kept rank, exact rank) for singular values ``s.S``; never above the exact rank.

        Args:
            s (SVD): the update's SVD (only ``S`` and ``floor`` are read).
        """
        exact = s.exact_rank()
        if self.kind == "exact":
            return exact, exact
        if self.kind == "fixed":
            return min(int(self.value), exact), exact
        return min(s.energy_rank(self.value), exact), exact

    def __str__(self) -> str:
        return {"exact": "exact", "fixed": f"{int(self.value)}", "energy": f"energy:{self.value:g}"}[self.kind]


@dataclass(frozen=True)
class Refactored:
    """One module re-factored.

    Args:
        lowrank (LowRank): the factors to write, scale folded (scale 1).
        rank (int): kept rank. exact_rank (int): the update's numerical rank.
        error (float): ``||written - update||_F``. rel_error (float): the same over ``||update||_F``.
        norm (float): ``||update||_F``.
    """

    lowrank: LowRank
    rank: int
    exact_rank: int
    error: float
    rel_error: float
    norm: float


def refactor(x: LowRank, policy: RankPolicy) -> Refactored:
    """Re-factor ``x`` at the rank ``policy`` chooses: ``B = U_k sqrt(S_k)``, ``A = sqrt(S_k) Vh_k``.

    Args:
        x (LowRank): the update, (out, in), any stored rank.
        policy (RankPolicy): the rank rule.

    Returns:
        Refactored with the exact Eckart-Young error of the cut.
    """
    s = x.svd()
    k, exact = policy.choose(s)
    norm = float((s.S**2).sum().sqrt())
    err = s.dropped_error(k)
    return Refactored(s.truncate(k), k, exact, err, err / norm if norm > 0 else err, norm)
