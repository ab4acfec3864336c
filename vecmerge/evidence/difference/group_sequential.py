"""The group-sequential Welch test of pre-registered plans: registered so a plan's stored name is checked.

It decides from a plan's planned looks (``stats.planned``, boundaries in ``stats.group_sequential``), never
in ``compare``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from .registry import PLAN, Scores, register
from .result import DiffResult


@register
@dataclass(frozen=True)
class GroupSequential:
    name: str = "group-sequential"
    summary: str = "group-sequential Welch test over a plan's looks, alpha and beta spending (stats.planned)"
    needs: str = PLAN
    decides: int = 0
    shown: int = 0

    def run(self, scores: Scores, confidence: float) -> DiffResult | None:
        return None  # judged from a plan's looks by stats.planned.decide, not from two score sets

    def size(self, result: Mapping) -> str:
        return ""


GROUP_SEQUENTIAL = GroupSequential()
