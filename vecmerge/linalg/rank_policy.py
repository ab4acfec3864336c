"""The one rank rule: how many singular directions each written module keeps (torch-free until it chooses).

``RankPolicy.parse`` reads what users type for a merge or a recipe (``exact``, ``N``, ``energy:E``,
``step-energy:E``, ``keep-base``), ``RankPolicy.parse_extract`` what ``vecmerge extract --rank`` takes
(``N``, ``energy:E``, ``auto``: the Gavish-Donoho threshold, see ``linalg.dense_cut``), both without
importing torch, so the recipe and the CLI can validate them; ``choose`` imports the float64 kernels.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import RecipeError

RANK_KINDS = ("exact", "fixed", "energy", "step-energy", "keep-base")  # a merge's, a recipe's
EXTRACT_KINDS = ("fixed", "energy", "auto")  # extract's (a fine-tune's difference: no step, no backbone)


@dataclass(frozen=True)
class RankPolicy:
    """How many singular directions each written module keeps.

    Args:
        kind (str): ``exact``, ``fixed`` (the best rank-``value`` cut), ``energy`` (smallest rank keeping
            share ``value`` of the squared norm of the written update, backbone included),
            ``step-energy`` (smallest rank whose cut loses at most ``1 - value`` of the *step's* squared
            norm; only with a step), ``keep-base`` (the backbone's factors kept, the step's exact
            factors appended; only for a step from one backbone adapter) or ``auto`` (extract only: the
            singular values above a noise threshold, ``linalg.dense_cut``).
        value (float): the rank for ``fixed``, the energy share for ``energy`` and ``step-energy``.
    """

    kind: str = "exact"
    value: float = 0.0

    @classmethod
    def _read(cls, text) -> RankPolicy | None:
        """Any kind from its text (``auto`` | ``exact`` | ``keep-base`` | ``N`` | ``energy:E`` | ``step-energy:E``,
        0 < E <= 1), or None."""
        s = str(text).strip().lower()
        if s in ("exact", "keep-base", "auto"):
            return cls(s)
        if s.isdigit() and int(s) >= 1:
            return cls("fixed", int(s))
        for kind in ("energy", "step-energy"):
            if s.startswith(kind + ":"):
                try:
                    e = float(s.split(":", 1)[1])
                except ValueError:
                    e = -1.0
                if 0.0 < e <= 1.0:
                    return cls(kind, e)
        return None

    @classmethod
    def parse(cls, text) -> RankPolicy:
        """A merge's or a recipe's rank: ``exact`` | ``N`` | ``energy:E`` | ``step-energy:E`` (0 < E <= 1) |
        ``keep-base``."""
        policy = cls._read(text)
        if policy is None or policy.kind not in RANK_KINDS:
            raise RecipeError([f"rank={text!r}: use 'exact', a positive integer, 'energy:E' or 'step-energy:E' "
                               "with 0 < E <= 1, or 'keep-base'"])
        return policy

    @classmethod
    def parse_extract(cls, text) -> RankPolicy:
        """``vecmerge extract --rank``: ``N`` | ``energy:E`` (0 < E <= 1) | ``auto``."""
        policy = cls._read(text)
        if policy is None or policy.kind not in EXTRACT_KINDS:
            raise RecipeError([f"--rank {text!r}: use a positive integer N, energy:E with 0 < E <= 1, or auto"],
                              "extract")
        return policy

    @property
    def lossless(self) -> bool:
        """True when the written update equals the intended one to the output dtype (no cut)."""
        return self.kind in ("exact", "keep-base")

    def choose(self, S, floor: float = 0.0, step_norm: float | None = None) -> tuple[int, int]:
        """(kept rank, exact rank) for singular values ``S`` (descending); never above the exact rank.

        The exact rank is the smallest k with ``sqrt(sum_{i>=k} S_i^2) <= EXACT_RTOL * max(||S||, floor)``;
        ``energy:E`` keeps the smallest k with ``sum_{i<k} S_i^2 >= E sum S_i^2``; ``step-energy:E`` the
        smallest k with ``sum_{i>=k} S_i^2 <= (1 - E) ||step||^2`` (the cut loses at most 1 - E of the
        step's squared norm; Eckart-Young makes that tail the cut's exact squared error).

        Args:
            S (Tensor): (k,) singular values, descending. floor (float): round-off scale of the factors.
            step_norm (float | None): ``||step_m||_F`` of this module (``step-energy`` only).
        """
        import torch

        from .lowrank import EXACT_RTOL, energy_rank, rank_for_error

        if self.kind == "keep-base":
            raise RecipeError(["rank=keep-base keeps the backbone's factors; it has no cut to choose"])
        if self.kind == "auto":
            raise RecipeError(["rank=auto is extract's noise threshold (linalg.dense_cut.cut_module); a merge "
                               "takes exact, N, energy:E, step-energy:E or keep-base"])
        exact = rank_for_error(S, EXACT_RTOL, floor)
        if self.kind == "exact":
            return exact, exact
        if self.kind == "fixed":
            return min(int(self.value), exact), exact
        if self.kind == "step-energy":
            if step_norm is None:
                raise RecipeError([f"rank={self}: measures the step, and this update has none; use energy:E"])
            tail = torch.flip(torch.cumsum(torch.flip(S**2, [0]), 0), [0])  # tail[i] = sum_{j>=i} S_j^2
            return min(int((tail > (1.0 - self.value) * step_norm**2).sum()), exact), exact
        return min(energy_rank(S, self.value), exact), exact

    def __str__(self) -> str:
        return {"exact": "exact", "fixed": f"{int(self.value)}", "energy": f"energy:{self.value:g}",
                "step-energy": f"step-energy:{self.value:g}", "keep-base": "keep-base", "auto": "auto"}[self.kind]
