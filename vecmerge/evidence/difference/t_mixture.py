"""The anytime-valid t-mixture test of pre-registered plans: registered so a plan's stored name is checked.

It decides from a plan's looks (``stats.sequential``, where its formulas are), never in ``compare``.
"""

from __future__ import annotations

from .registry import PlanTest, register

T_MIXTURE = register(PlanTest("t-mixture", "anytime-valid Gaussian-mixture t test of a pre-registered plan "
                              "(stats.sequential)"))
