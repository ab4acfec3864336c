"""The names users type, in one torch-free place: scopes, consensus actions, dtypes, rank policies, views.

The recipe schema, the CLI's ``click.Choice`` lists and the docs all read these tuples, so a name is
spelled once. Nothing here imports torch (``vecmerge --help`` stays fast); ``RankPolicy.choose``
imports the float64 kernels only when it runs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .errors import RecipeError

SCOPES = ("global", "module")
SCOPE_HELP = ("global: one alpha from the norms over all modules, ||alpha*dir|| = T*||base||; module: an alpha per "
              "module, so that each module moves the share T of its own norm.")
ON_DISAGREE = ("fail", "drop", "keep")
ON_DISAGREE_HELP = ("What to do with modules whose <ref_m, dir_m> <= 0: fail (exit 1, write nothing), drop (zero "
                    "them in the direction before alpha is chosen; reported as dropped by consensus), keep (step "
                    "anyway).")
DTYPE_NAMES = ("fp32", "bf16", "fp16")
DTYPE_HELP = "Dtype of the written factors; the report says how far rounding moved the update and the step."
MODULES_TO_SAVE = ("refuse", "drop")
MODULES_TO_SAVE_HELP = ("Adapters that also save full modules (modules_to_save, e.g. a trained lm_head): refuse them, "
                        "or drop those full weights and use the LoRA part only (an output then saves none).")
RANK_KINDS = ("exact", "fixed", "energy", "step-energy", "keep-base")
RANK_HELP = ("Rank of the written factors: exact (lossless, drops only float64 round-off), N (the optimal rank-N "
             "cut, its error reported exactly), energy:E (smallest rank keeping the share E of the squared norm of "
             "the whole written update)")
STEP_RANK_HELP = (", step-energy:E (smallest rank whose cut loses at most 1-E of the step's squared norm: use it "
                  "when the step is small next to the backbone, which energy:E may cut away)")
KEEP_BASE_HELP = ", keep-base (the backbone's own factors bit for bit, the step's exact factors appended)"
ALLOW_MISSING_HELP = "Read modules missing from an adapter as zero (they are listed in the report)."
ALLOW_BASE_MISMATCH_HELP = ("Combine adapters whose adapter_config.json declare different base models (refused "
                            "otherwise, even when the shapes match); the manifest records it.")
BASE_MODEL_ID_HELP = ("Hub id of the base model, e.g. Qwen/Qwen3-0.6B, written as base_model_name_or_path and in the "
                      "model card (default: base_model_id in vecmerge.yaml, else the inputs' own, often a local path).")
AUDIT_VIEWS = ("module", "layer", "type", "grid")
AUDIT_VIEW_HELP = ("Rows: one per module; modules pooled by layer or by module type; or a layer x type grid (modules "
                   "without a layer index, such as embedding LoRA, in a row of their own).")
AUDIT_SORTS = ("module", "cosine", "inner", "layer", "type")
AUDIT_SORT_HELP = "Row order: module name (natural), cosine or inner product (ascending: worst first), layer, type."
REPORT_FORMAT_HELP = "table (summary and view), json (everything), csv (the view only) or markdown."
REPORT_FORMATS = ("table", "json", "csv", "markdown")
# A hub id as the Hugging Face Hub spells it: NAME or ORG/NAME (letters, digits, '-', '_', '.').
HUB_ID_RE = r"[A-Za-z0-9][A-Za-z0-9_.\-]*(/[A-Za-z0-9][A-Za-z0-9_.\-]*)?"


def is_hub_id(text) -> bool:
    """Whether ``text`` reads as a Hugging Face Hub model id (``ORG/NAME`` or ``NAME``), not a local path."""
    return isinstance(text, str) and re.fullmatch(HUB_ID_RE, text) is not None and ".." not in text


@dataclass(frozen=True)
class RankPolicy:
    """How many singular directions each written module keeps.

    Args:
        kind (str): ``exact``, ``fixed`` (the best rank-``value`` cut), ``energy`` (smallest rank keeping
            share ``value`` of the squared norm of the written update, backbone included),
            ``step-energy`` (smallest rank whose cut loses at most ``1 - value`` of the *step's* squared
            norm; only with a step) or ``keep-base`` (the backbone's factors kept, the step's exact
            factors appended; only for a step from one backbone adapter).
        value (float): the rank for ``fixed``, the energy share for ``energy`` and ``step-energy``.
    """

    kind: str = "exact"
    value: float = 0.0

    @classmethod
    def parse(cls, text) -> RankPolicy:
        """``exact`` | ``N`` | ``energy:E`` | ``step-energy:E`` (0 < E <= 1) | ``keep-base``."""
        s = str(text).strip().lower()
        if s in ("exact", "keep-base"):
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
        raise RecipeError([f"rank={text!r}: use 'exact', a positive integer, 'energy:E' or 'step-energy:E' with "
                           "0 < E <= 1, or 'keep-base'"])

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

        from .linalg.lowrank import EXACT_RTOL, energy_rank, rank_for_error

        if self.kind == "keep-base":
            raise RecipeError(["rank=keep-base keeps the backbone's factors; it has no cut to choose"])
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
                "step-energy": f"step-energy:{self.value:g}", "keep-base": "keep-base"}[self.kind]

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
