"""What the spectral merges share: the scale ``lambda``, the weighted cores, checks on the models.

TSV-M, Iso-C, Iso-CTS, KnOTS and SVC (one file each) run on the module's cores with ``linalg/spectral.py``:
exact, never dense (see there). Each model's update enters as ``w_i DeltaW_i`` (weights default 1, as the
papers' unweighted task vectors); ``lambda`` is the papers' global scale of the merged update (their
``alpha``), default 1.
"""

from __future__ import annotations

from .base import Field

SCALE = Field("lambda", "the merged update times this (the papers' alpha; mergekit's lambda)", default=1.0)


def weighted_cores(x) -> list:
    """``[w_i C_i]``: each model's weighted core in the module's basis."""
    return [m.C * w for w, m in zip(x.weights, x.models)]


def no_density(recipe, name: str) -> list[str]:
    if any(e.get("density") is not None for e in recipe.models or []):
        return [f"method={name}: takes no density; drop it from models"]
    return []
