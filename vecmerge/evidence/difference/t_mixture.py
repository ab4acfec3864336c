"""The anytime-valid t-mixture test of pre-registered plans: registered so a plan's stored name is checked.

It decides from a plan's looks (``stats.sequential``, where its formulas are), never in ``compare``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from .registry import PLAN, Scores, register
from .result import DiffResult


@register
@dataclass(frozen=True)
class TMixture:
    name: str = "t-mixture"
    summary: str = "anytime-valid Gaussian-mixture t test of a pre-registered plan (stats.sequential)"
    needs: str = PLAN
    decides: int = 0
    shown: int = 0

    def run(self, scores: Scores, confidence: float) -> DiffResult | None:
        return None  # judged from a plan's looks by stats.sequential.decide, not from two score sets

    def size(self, result: Mapping) -> str:
        return ""


T_MIXTURE = TMixture()
