"""The group-sequential Welch test of pre-registered plans: registered so a plan's stored name is checked.

It decides from a plan's planned looks (``stats.planned``, boundaries in ``stats.group_sequential``), never
in ``compare``.
"""

from __future__ import annotations

from .registry import PlanTest, register

GROUP_SEQUENTIAL = register(PlanTest("group-sequential", "group-sequential Welch test over a plan's looks, alpha "
                                     "and beta spending (stats.planned)"))
