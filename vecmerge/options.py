"""The names users type, in one torch-free place: scopes, consensus actions, dtypes, rank policies, views.

The recipe schema, the CLI's ``click.Choice`` lists and the docs all read these tuples, so a name is
spelled once. Nothing here imports torch (``vecmerge --help`` stays fast). The rank rule itself is
``linalg.rank_policy.RankPolicy``.
"""

from __future__ import annotations

import re

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
