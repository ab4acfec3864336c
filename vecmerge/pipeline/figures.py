"""What survived: per module and overall, the written update against the intended one and the step.

With T the intended update, R the re-factored one (in the module's basis) and W = R + E the stored
one (E: the dtype rounding), everything from cores plus one Gram product per module::

    ||W - T||^2 = ||R - T||^2 + ||E||^2 + 2 <R - T, E>
    survival    = sum_m <W_m - base_m, step_m> / ||step||^2     (1: the whole step landed)
    residual    = ||W - T|| / ||step||
    dtype_effect = ||E|| / ||T||   (and ||E|| / ||step||)

A merge (``vecmerge merge``) has no base: its step is the whole update, so ``survival = sum_m <W_m,
T_m> / ||T||^2`` (1: all of the intended merge landed), and ``moved`` says how far the intended merge
lies from each model, ``||T - x_i|| / ||x_i||`` over all modules (the user's v58 step was 1.13%). For a
dense target (a dense-space merge) the errors and inner products are measured on the dense matrix.
"""

from __future__ import annotations

import math
import statistics
from typing import TYPE_CHECKING, Any

import torch

from ..errors import NumericError
from ..linalg.lowrank import LowRank, f64
from ..linalg.subspace import InSpan, Subspace

if TYPE_CHECKING:  # build and evaluation import this module
    from .build import ModuleBuild
    from .evaluation import Evaluation


def check_figures(fig: dict) -> None:
    """NumericError naming the first module whose figures are not finite (a safety net: nothing passes on NaN)."""
    for m, entry in fig["modules"].items():
        bad = [k for k, v in entry.items() if isinstance(v, float) and not math.isfinite(v)]
        if bad:
            raise NumericError(f"module {m}: {bad[0]} is {entry[bad[0]]} (a non-finite intermediate); "
                               "the inputs' magnitudes are extreme, check their lora_alpha and the coefficients")
    bad = [k for k, v in fig.items() if isinstance(v, float) and not math.isfinite(v)]
    if bad:
        raise NumericError(f"the output's {bad[0]} is {fig[bad[0]]} (a non-finite intermediate); the inputs' "
                           "magnitudes are extreme, check their lora_alpha and the coefficients")


def _rounding_terms(written: LowRank, exact: LowRank
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(dB, A1, B2, dA)`` with ``E = W - R = dB A1 + B2 dA`` (``B1 = s_W B_W``, ``B2 = s_R B_R``)."""
    dev = exact.device
    B1, A1 = written.scale * f64(written.B.to(dev)), f64(written.A.to(dev))
    B2, A2 = exact.scale * f64(exact.B), f64(exact.A)
    return B1 - B2, A1, B2, A1 - A2


def _differences(written: LowRank, exact: LowRank) -> tuple[torch.Tensor, torch.Tensor]:
    """``(dB, dA)`` of ``_rounding_terms``, bit for bit, in one pass each where both scales are 1 (the cut's
    factors and their stored copy: no scaled copies, the stored dtype promoted to float64 inside the subtraction,
    exactly)."""
    if written.scale != 1.0 or exact.scale != 1.0:
        dB, _, _, dA = _rounding_terms(written, exact)
        return dB, dA
    dev = exact.device
    return (torch.sub(written.B.to(dev), f64(exact.B)), torch.sub(written.A.to(dev), f64(exact.A)))


def _rounding_sq(dB: torch.Tensor, A1: torch.Tensor, B2: torch.Tensor, dA: torch.Tensor) -> float:
    """``||dB A1 + B2 dA||^2`` from Gram blocks: ``<dB^T dB, A1 A1^T> + <B2^T B2, dA dA^T> + 2 <dB^T B2, A1 dA^T>``.

    Every term is of the order of the rounding (no cancellation of large terms), so no digits are lost.
    """
    return float(((dB.T @ dB) * (A1 @ A1.T)).sum() + ((B2.T @ B2) * (dA @ dA.T)).sum()
                 + 2.0 * ((dB.T @ B2) * (A1 @ dA.T)).sum())


def rounding(written: LowRank, exact: LowRank, space: Subspace, cores: tuple | None = None
             ) -> tuple[float, torch.Tensor]:
    """``E = W - R`` of a rounded copy W of factors R: ``(||E||_F, Qb^T E Qa)``.

    ``E = dB A1 + B2 dA`` with ``B1 = s_W B_W``, ``B2 = s_R B_R``, ``dB = B1 - B2``, ``dA = A1 - A2``. When
    the cut knows R's cores (``B2 = Qb L``, ``A2 = Rc Qa^T``), only ``P_b = Qb^T dB``, ``P_a = dA Qa``,
    ``dB^T dB`` and ``dA dA^T`` touch the full size; with ``A1 Qa = Rc + P_a``::

        Qb^T E Qa = P_b (Rc + P_a) + L P_a
        ||E||^2   = <dB^T dB, A1 A1^T> + <L^T L, dA dA^T> + 2 <P_b^T L, A1 dA^T>
        A1 A1^T   = Rc Rc^T + Rc P_a^T + P_a Rc^T + dA dA^T,    A1 dA^T = Rc P_a^T + dA dA^T

    (the bases are orthonormal: ``B2^T B2 = L^T L``, ``dB^T B2 = P_b^T L``). Every term is of the order
    of the rounding or multiplies it (no cancellation of large terms), so no digits are lost; the cost is
    half that of the six full-size Gram products of the general form (``_rounding_sq``).

    Args:
        written (LowRank): W as stored. exact (LowRank): R before rounding. space (Subspace): the basis.
        cores (tuple[Tensor, Tensor] | None): ``(L (p, k), Rc (k, q))``, R's cores when the cut knows
            them (a core's ``U_k sqrt(S_k)`` and ``sqrt(S_k) V_k^T``, the scale folded in).
    """
    if exact.rank == 0:
        return 0.0, space.zero().C
    if cores is None:
        dB, A1, B2, dA = _rounding_terms(written, exact)
        core = space.core_of(torch.cat([dB, B2], 1), torch.cat([A1, dA], 0))
        return max(_rounding_sq(dB, A1, B2, dA), 0.0) ** 0.5, core
    dB, dA = _differences(written, exact)
    L, Rc = cores
    Pb, Pa = space.core_of_left(dB), space.core_of_right(dA)
    dAdA = dA @ dA.T
    cross = Rc @ Pa.T
    A1A1 = Rc @ Rc.T + cross + cross.T + dAdA
    sq = float(((dB.T @ dB) * A1A1).sum() + ((L.T @ L) * dAdA).sum() + 2.0 * ((Pb.T @ L) * (cross + dAdA)).sum())
    return max(sq, 0.0) ** 0.5, Pb @ (Rc + Pa) + L @ Pa


def rounding_norm(written: LowRank, exact: LowRank) -> float:
    """``||W - R||_F`` of a rounded copy W of factors R (``rounding`` without a basis)."""
    if exact.rank == 0:
        return 0.0
    return max(_rounding_sq(*_rounding_terms(written, exact)), 0.0) ** 0.5


def module_figures(ev: Evaluation, m: str, r: ModuleBuild) -> tuple[dict, tuple]:
    """One module's entry of ``figures`` and its parts of the sums: ``(entry, (||W-T||^2, ||E||^2, ||T||^2,
    ||step||^2, landed))`` with ``landed`` the inner product that survival sums (``<W - base, step>`` or,
    for a merge, ``<W, T>``; 0.0 when neither applies).

    Args:
        ev (Evaluation): the evaluated recipe (its base cores). m (str): the module. r (ModuleBuild): its build.
    """
    e_norm = r.rounding
    if r.error is not None:
        err = r.error
    else:
        target, kept, e_core = _core(r)
        diff = kept - target.C
        err = max(float((diff**2).sum()) + e_norm**2 + 2 * float((diff * e_core).sum()), 0.0) ** 0.5
    tn = r.target_norm if r.target_norm is not None else _core(r)[0].norm()
    entry: dict[str, Any] = {"rank": r.written.rank, "exact_rank": r.cut.exact_rank,
                             "rel_error": err / tn if tn > 0 else err, "cut_error": r.cut.error}
    if r.cut.method != "core":
        entry["cut"] = r.cut.method
        if r.cut.power_iters is not None:
            entry["power_iters"] = r.cut.power_iters
    step_sq = landed = 0.0
    if ev.recipe.kind == "merge":
        if r.inner is not None:
            landed = r.inner
        else:
            target, kept, e_core = _core(r)
            landed = float((kept * target.C).sum()) + float((e_core * target.C).sum())
        entry["survival"] = landed / (tn * tn) if tn > 0 else 1.0
    if ev.step is not None and r.step is not None:  # a stepped build has its step's core
        _, kept, e_core = _core(r)
        s = r.step.C
        sn = float(torch.linalg.matrix_norm(s))
        landed = float(((kept - ev.operands["base"][m].C) * s).sum()) + float((e_core * s).sum())
        step_sq = sn * sn
        entry["step_norm"] = sn
        entry["survival"] = landed / step_sq if sn > 0 else 1.0
    return entry, (err * err, e_norm * e_norm, tn * tn, step_sq, landed)


def _core(r: ModuleBuild) -> tuple[InSpan, torch.Tensor, torch.Tensor]:
    """``(target, kept, rounding core)`` of a build in its module's basis (ValueError for another build, which
    carries its error, inner product and norm instead: a caller's error)."""
    if r.target is None or r.cut.kept is None or r.rounding_core is None:
        raise ValueError("module_figures: a dense or factored build gives its error, inner product and norm")
    return r.target, r.cut.kept, r.rounding_core


def figures(ev: Evaluation, rows: dict) -> dict:
    """Survival, residual, dtype effect, per-module rank and error of one output (see the module docstring).

    Args:
        ev (Evaluation): the evaluated recipe (its base cores). rows (dict[str, ModuleBuild]): per module
            (its ``figure`` when the build measured it already).

    Returns:
        ``{modules: {m: {rank, exact_rank, rel_error, cut_error[, step_norm, survival]}}, rank: {min, median,
        max}, rel_error, dtype_effect, norm (||T||, the intended update)[, survival, residual,
        dtype_effect_on_step]}``.
    """
    has_step = ev.step is not None
    merge = ev.recipe.kind == "merge"
    per = {}
    resid_sq = dtype_sq = target_sq = step_sq = inner_sum = 0.0
    for m, r in rows.items():
        entry, (e2, d2, t2, s2, landed) = r.figure if r.figure is not None else module_figures(ev, m, r)
        per[m] = dict(entry)
        resid_sq, dtype_sq, target_sq = resid_sq + e2, dtype_sq + d2, target_sq + t2
        step_sq, inner_sum = step_sq + s2, inner_sum + landed
    ranks = [e["rank"] for e in per.values()]
    fig = {"modules": per,
           "rank": {"min": min(ranks), "median": statistics.median(ranks), "max": max(ranks)},
           "rel_error": math.sqrt(resid_sq / target_sq) if target_sq > 0 else math.sqrt(resid_sq),
           "dtype_effect": math.sqrt(dtype_sq / target_sq) if target_sq > 0 else 0.0,
           "norm": math.sqrt(target_sq)}
    if merge:
        fig["survival"] = inner_sum / target_sq if target_sq > 0 else 1.0
        labels = [e["model"] for e in ev.recipe.models or []]
        sums = [[0.0, 0.0] for _ in labels]
        for r in rows.values():
            for acc, (d2, n2) in zip(sums, r.moved or ()):
                acc[0] += d2
                acc[1] += n2
        fig["moved"] = [{"model": lab, "distance": math.sqrt(d2 / n2) if n2 > 0 else None}
                        for lab, (d2, n2) in zip(labels, sums)]
    if has_step:
        fig["survival"] = inner_sum / step_sq if step_sq > 0 else 1.0
        fig["residual"] = math.sqrt(resid_sq / step_sq) if step_sq > 0 else 0.0
        fig["dtype_effect_on_step"] = math.sqrt(dtype_sq / step_sq) if step_sq > 0 else 0.0
    return fig
