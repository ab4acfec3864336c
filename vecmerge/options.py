"""The names users type, in one torch-free place: scopes, consensus actions, dtypes, views, hub ids.

The recipe's table of keys (``recipe/keys.py``, which also holds each recipe key's help), the CLI's
``click.Choice`` lists and the docs read these tuples, so a name is spelled once. Nothing here imports
torch (``vecmerge --help`` stays fast). The rank rule itself is ``linalg.rank_policy.RankPolicy``.
"""

from __future__ import annotations

import re

SCOPES = ("global", "module")
ON_DISAGREE = ("fail", "drop", "keep")
DTYPE_NAMES = ("fp32", "bf16", "fp16")
MODULES_TO_SAVE = ("refuse", "drop")
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
