"""Training replicates: independent trainings of one configuration, and the test of X against Y whose unit is a
training.

A workspace entry ``replicate_of: v54`` is another training of v54's configuration; v54 and its replicates are
one *replicate group* (``Workspace.replicate_groups``), whose evaluations give the variance components
(``variance.py``). Training test of X against Y:

    m_s  = the mean over side s's k_s trainings of each training's mean run
    s²_T = pooled variance of training means within the groups of X and Y (df_T = Σ_g (k_g - 1))
    diff = m_X - m_Y,   SE = s_T · sqrt(1/k_X + 1/k_Y),   t on df_T degrees of freedom

A side without replicates counts as one training, with the other side's training noise.
Why the unit is a training: docs/design/evidence.md.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from .noise import PooledNoise, pooled_noise
from .stats import DiffResult, difference_test
from .variance import VarianceComponents, variance_components


def group_of(name: str, groups: Mapping[str, Sequence[str]] | None) -> str | None:
    """The replicate group ``name`` belongs to (its root's name), or None."""
    for root, members in (groups or {}).items():
        if name == root or name in members:
            return root
    return None


def members(names: Iterable[str], groups: Mapping[str, Sequence[str]] | None) -> set[str]:
    """``names`` and every member of their replicate groups."""
    out = set()
    for name in names:
        out |= set(trainings(group_of(name, groups) or name, groups, {}))
    return out


def trainings(root: str, groups: Mapping[str, Sequence[str]] | None, runs: Mapping[str, Sequence[float]]
              ) -> dict[str, list[float]]:
    """``{member: its runs}`` of the group ``root`` (just ``{root: runs}`` for a name without replicates)."""
    members = list(dict.fromkeys([root, *(groups or {}).get(root, ())]))
    return {m: list(runs.get(m, [])) for m in members}


def components(name: str, groups: Mapping[str, Sequence[str]] | None, runs: Mapping[str, Sequence[float]], *,
               metric: str = "", env: str | None = None, confidence: float = 0.95) -> VarianceComponents | None:
    """The variance components of the group ``name`` belongs to (None: no group, or not separable)."""
    root = group_of(name, groups)
    if root is None:
        return None
    return variance_components(trainings(root, groups, runs), group=root, metric=metric, env=env,
                               confidence=confidence)


@dataclass(frozen=True)
class ReplicateEvidence:
    """What the replicates of A and B say: each group's components, the pooled training noise, the training test.

    ``noise`` is s_T (``PooledNoise`` of training means: its sd, df and groups); ``test`` the training test of
    A against B (kind ``trainings``, n = (k_A, k_B)); None where it cannot be computed (``reason`` says why).
    """

    a: str
    b: str
    groups: tuple[VarianceComponents, ...]
    noise: PooledNoise | None
    test: DiffResult | None
    trainings: tuple[tuple[str, ...], tuple[str, ...]]
    reason: str | None = None

    def to_dict(self) -> dict:
        return {"a": self.a, "b": self.b, "groups": [g.to_dict() for g in self.groups],
                "noise": self.noise.to_dict() if self.noise else None,
                "test": self.test.to_dict() if self.test else None,
                "trainings": [list(t) for t in self.trainings], "reason": self.reason}


def replicate_evidence(a: str, b: str, runs: Mapping[str, Sequence[float]],
                       groups: Mapping[str, Sequence[str]] | None, *, metric: str = "", env: str | None = None,
                       confidence: float = 0.95) -> ReplicateEvidence | None:
    """The training test of A against B and the components of their groups (module docstring).

    Args:
        a, b (str): the models compared. runs: model -> its whole-run values on the metric (one environment).
        groups (Mapping[str, Sequence[str]] | None): replicate groups, root -> its members.

    Returns:
        ReplicateEvidence, or None when neither A nor B belongs to a group with two trainings that have runs.
    """
    roots = {side: group_of(side, groups) or side for side in (a, b)}
    per_side = {side: {m: v for m, v in trainings(roots[side], groups, runs).items() if v} for side in (a, b)}
    replicated = [roots[s] for s in (a, b) if len(per_side[s]) >= 2]
    if not replicated:
        return None
    means = {s: [math.fsum(v) / len(v) for v in per_side[s].values()] for s in (a, b)}
    noise = pooled_noise({roots[s]: means[s] for s in dict.fromkeys((a, b)) if len(per_side[s]) >= 2})
    comps = tuple(c for c in (components(r, groups, runs, metric=metric, env=env, confidence=confidence)
                              for r in dict.fromkeys(replicated)) if c is not None)
    names = (tuple(per_side[a]), tuple(per_side[b]))
    if roots[a] == roots[b]:
        return ReplicateEvidence(a, b, comps, noise, None, names, f"{a} and {b} are trainings of one configuration")
    ka, kb = len(means[a]), len(means[b])
    if not ka or not kb:
        missing = a if not ka else b
        return ReplicateEvidence(a, b, comps, noise, None, names, f"no runs of {missing} or its replicates")
    diff = math.fsum(means[a]) / ka - math.fsum(means[b]) / kb
    test = None
    if noise is not None:
        test = difference_test("trainings", diff, noise.sd * math.sqrt(1 / ka + 1 / kb), noise.df, (ka, kb),
                               confidence)
    reason = None if test is not None else "the trainings' means do not vary: training noise cannot be estimated"
    return ReplicateEvidence(a, b, comps, noise, test, names, reason)
