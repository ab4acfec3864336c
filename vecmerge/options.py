"""The names users type, in one torch-free place: scopes, consensus actions, dtypes, rank policies, views.

The recipe schema, the CLI's ``click.Choice`` lists and the docs all read these tuples, so a name is
spelled once. Nothing here imports torch (``vecmerge --help`` stays fast); ``RankPolicy.choose``
imports the float64 kernels only when it runs.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import RecipeError

SCOPES = ("global", "module")
SCOPE_HELP = "global: alpha from the norms over all modules; module: each module moves the same share of its own norm"
ON_DISAGREE = ("fail", "drop", "keep")
ON_DISAGREE_HELP = ("what to do with modules whose <ref_m, dir_m> <= 0: fail (exit 1, write nothing), "
                    "drop (zero them in the direction before alpha is chosen), keep (step anyway)")
DTYPE_NAMES = ("fp32", "bf16", "fp16")
DTYPE_HELP = "dtype of the written factors; the report says how far rounding moved the update"
MODULES_TO_SAVE = ("refuse", "drop")
MODULES_TO_SAVE_HELP = ("adapters that also save full modules (modules_to_save): refuse them, or drop those "
                        "full weights and merge the LoRA part only")
RANK_KINDS = ("exact", "fixed", "energy", "keep-base")
RANK_HELP = ("rank of the written factors: exact (lossless, drops only float64 round-off), N (the optimal rank-N "
             "cut, error reported exactly), energy:E (smallest rank keeping share E of the update's squared norm)")
KEEP_BASE_HELP = ", keep-base (the backbone's own factors bit for bit, the step appended)"
AUDIT_VIEWS = ("module", "layer", "type", "grid")
AUDIT_VIEW_HELP = "one row per module, pooled by layer or by module type, or a layer x type grid"
AUDIT_SORTS = ("module", "cosine", "inner", "layer", "type")
AUDIT_SORT_HELP = "row order: module name (natural), cosine or inner product (ascending: worst first), layer, type"
REPORT_FORMATS = ("table", "json", "csv", "markdown")


@dataclass(frozen=True)
class RankPolicy:
    """How many singular directions each written module keeps.

    Args:
        kind (str): ``exact``, ``fixed`` (the best rank-``value`` cut), ``energy`` (smallest rank keeping
            share ``value`` of the squared norm) or ``keep-base`` (the backbone's factors kept, the
            step's exact factors appended; only for a step from one backbone adapter).
        value (float): the rank for ``fixed``, the energy share for ``energy``.
    """

    kind: str = "exact"
    value: float = 0.0

    @classmethod
    def parse(cls, text) -> RankPolicy:
        """``exact`` | ``N`` | ``energy:E`` (0 < E <= 1) | ``keep-base``."""
        s = str(text).strip().lower()
        if s in ("exact", "keep-base"):
            return cls(s)
        if s.isdigit() and int(s) >= 1:
            return cls("fixed", int(s))
        if s.startswith("energy:"):
            try:
                e = float(s.split(":", 1)[1])
            except ValueError:
                e = -1.0
            if 0.0 < e <= 1.0:
                return cls("energy", e)
        raise RecipeError([f"rank={text!r}: use 'exact', a positive integer, 'energy:E' with 0 < E <= 1, "
                           "or 'keep-base'"])

    @property
    def lossless(self) -> bool:
        """True when the written update equals the intended one to the output dtype (no cut)."""
        return self.kind in ("exact", "keep-base")

    def choose(self, S, floor: float = 0.0) -> tuple[int, int]:
        """(kept rank, exact rank) for singular values ``S`` (descending); never above the exact rank.

        The exact rank is the smallest k with ``sqrt(sum_{i>=k} S_i^2) <= EXACT_RTOL * max(||S||, floor)``.

        Args:
            S (Tensor): (k,) singular values, descending. floor (float): round-off scale of the factors.
        """
        from .lowrank import EXACT_RTOL, energy_rank, rank_for_error

        if self.kind == "keep-base":
            raise RecipeError(["rank=keep-base keeps the backbone's factors; it has no cut to choose"])
        exact = rank_for_error(S, EXACT_RTOL, floor)
        if self.kind == "exact":
            return exact, exact
        if self.kind == "fixed":
            return min(int(self.value), exact), exact
        return min(energy_rank(S, self.value), exact), exact

    def __str__(self) -> str:
        return {"exact": "exact", "fixed": f"{int(self.value)}", "energy": f"energy:{self.value:g}",
                "keep-base": "keep-base"}[self.kind]

# vecmerge extract / fuse (the names live here so that the CLI stays torch-free)
EXTRACT_OTHERS = ("save", "drop")
EXTRACT_OTHERS_HELP = ("what to do with tensors outside --targets that differ (norms, biases, a resized vocabulary): "
                       "save their modules whole as modules_to_save, or drop them (listed in the manifest); required "
                       "when any differ")
EXTRACT_RANK_HELP = ("N (the rank-N cut of each module's difference), energy:E (each module's smallest rank keeping "
                     "share E of its squared norm, written with rank_pattern), or auto (singular values above a "
                     "Gavish-Donoho noise threshold, see docs)")
EXTRACT_TARGETS_HELP = ("comma-separated module names matched as PEFT does (q_proj, mlp.down_proj, embed_tokens, "
                        "lm_head) or all-linear (every linear/Conv1D weight but the output head)")
FUSE_DTYPE_HELP = ("dtype of every floating tensor written (default: each keeps the base's stored dtype, copied byte "
                   "for byte)")
