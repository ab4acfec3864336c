"""The written update against the one recomputed from the recipe: ``verify``'s ``update`` and ``step`` checks.

Per module m, with ``W_m`` read back from the output and ``I_m`` recomputed in factored float64
(``pipeline.evaluation.intended_core``):

- update: ``||W_m - I_m|| / ||I_m|| <= TOLERANCES[dtype]["update"]``; a rank-cut output (rank not
  ``exact``) instead must be I_m projected on W_m's own column space, ``||W_m - P_W I_m|| / ||I_m|| <= tol``
  (first order in any edit of W: every optimal and every range-finder cut is ``P_W I``), and reproduce its
  recorded per-module error within that tolerance, either way (``|recomputed - recorded| <= tol``); a failing
  module that is ``c * I_m`` is named with its scale ``c`` (a changed ``lora_alpha``);
- step: ``survival = sum_m <W_m - base_m, step_m> / ||step||^2`` within ``TOLERANCES[dtype]["survival"]``
  of 1 (of the recorded value for a rank-cut output); it fails when no module could be compared;
- bias (``lora_bias`` inputs or output): the written bias update ``scale * lora_B.bias`` against the recomputed
  one (``pipeline.bias.intended_bias``: exact, never cut), ``||b_m - i_m|| / ||i_m|| <= TOLERANCES[dtype]["update"]``.
"""

from __future__ import annotations

import math

import torch

from ...errors import VecmergeError, few
from ...linalg.dense import Dense
from ...linalg.lowrank import LowRank
from ...linalg.subspace import InSpan
from ...linalg.threads import map_modules
from ...peft.adapter import Adapter
from ...peft.format import CONFIG_NAME
from ...pipeline.bias import has_biases, intended_bias
from ...pipeline.evaluation import intended_core
from ..report import check, within


def _inner(W: LowRank, target) -> float:
    """``<W, target>`` for a LowRank or Dense target."""
    return target.inner(W) if isinstance(target, Dense) else W.inner(target)


def _distance(W: LowRank, target) -> float:
    """``||W - target||_F`` for a LowRank or Dense target."""
    return target.distance(W) if isinstance(target, Dense) else (W - target).norm()


def projected_residual(W: LowRank, target) -> float:
    """``||W - P_W T||_F`` with ``P_W = Q Q^T`` the projector on W's column space (Q from the SVD of W's B).

    Both terms lie in that space, so the norm is taken on ``Q^T W - Q^T T`` (k x in): no dense (out, in).
    Zero columns (a cut padded to a common rank) are not part of the space.

    Args:
        W (LowRank): the written update, (out, in). target (LowRank | Dense): the recomputed one, (out, in).
    """
    Bw = W.B.to(torch.float64)
    U, S, _ = torch.linalg.svd(Bw, full_matrices=False)
    Q = U[:, : int((S > S[0] * 1e-13).sum())] if S.numel() and S[0] > 0 else U[:, :0]
    qw = W.scale * ((Q.T @ Bw) @ W.A.to(torch.float64))
    if isinstance(target, Dense):
        qt = Q.T @ target.D.to(Q.device)
    else:
        qt = target.scale * ((Q.T @ target.B.to(torch.float64)) @ target.A.to(torch.float64))
    outside = 0.0 if Q.shape[1] == Bw.shape[1] else float(torch.linalg.matrix_norm(W.dense() - Q @ qw)) ** 2
    return math.sqrt(float(torch.linalg.matrix_norm(qw - qt)) ** 2 + outside)


def _scale_hint(W: LowRank, target, tol: float) -> float | None:
    """``c`` when ``W = c * target`` within ``tol`` (a changed scale), else None."""
    tn = target.norm()
    if tn == 0.0:
        return None
    c = _inner(W, target) / (tn * tn)
    return c if c != 0.0 and _distance(W * (1.0 / c), target) <= tol * tn else None


def compare_to_recomputed(out: Adapter, ev, manifest: dict, tol: dict, progress=None, keep_expected: bool = True
            ) -> tuple[list[dict], dict | None]:
    """Per module ``||W_m - I_m|| / ||I_m||`` and the step's survival; returns (checks, {m: I_m} or None).

    A dense-space merge's ``I_m`` is a dense matrix: formed, compared and released one module at a time
    (kept only with ``keep_expected``, for the PEFT checks of a lossless output).

    Args:
        out (Adapter): the written output. ev (Evaluation): the manifest's recipe re-evaluated.
        manifest (dict): vecmerge.json. tol (dict): ``TOLERANCES[dtype]``.
        keep_expected (bool): return every module's recomputed update.
    """
    recipe = ev.recipe
    cut = not recipe.rank_policy.lossless
    rec = manifest.get("modules") or {}
    base = ev.operands.get("base")
    rows, expected, shape_bad, hints = {}, {}, [], {}
    err_sq = tgt_sq = step_sq = moved = 0.0
    tu = tol["update"]

    def off(m, r):
        if not cut:
            return not within(r["rel_error"], tu)
        want = rec.get(m, {}).get("rel_error")
        return (not isinstance(want, (int, float)) or not within(abs(r["rel_error"] - want), tu)
                or not within(r["projected"], tu))

    def one(m: str) -> dict:
        """Module m measured alone (worker threads): its figures, or why it could not be compared."""
        core, step_core = intended_core(ev, m, recipe.multiple)  # norms and <base, step> from the cores
        target = core.lowrank() if isinstance(core, InSpan) else core
        step_m = None if step_core is None else step_core.lowrank()
        if isinstance(core, InSpan):
            core.space.release()  # the lifts above formed full-size arrays: one module's at a time
        got: dict = {"target": target if keep_expected else None}
        if m not in out.specs:
            return {**got, "bad": f"{m}: recomputed but not written"}
        if out.specs[m].shape != target.shape:
            return {**got, "bad": f"{m}: {out.specs[m].shape} written, {target.shape} expected"}
        try:
            W = out.factors(m)
        except VecmergeError:
            return {**got, "bad": f"{m}: unreadable or non-finite factors"}  # also reported by the finite check
        err, tn = _distance(W, target), core.norm()
        got.update(err=err, tn=tn, row={"rel_error": err / tn if tn > 0 else err})
        if cut:  # first order in any edit of W (the error itself moves only to second order: W is P_W I)
            p = projected_residual(W, target)
            got["row"]["projected"] = p / tn if tn > 0 else p
        if off(m, got["row"]):
            got["hint"] = _scale_hint(W, target, tu)
        if step_m is not None and step_core is not None:  # <W - base, step> = <W, step> - <base, step> (cores)
            sn = step_core.norm()
            got.update(sn=sn, mv=W.inner(step_m) - base[m].inner(step_core))
        return got

    for m, got in map_modules(one, list(ev.names), progress).items():  # summed in module order
        if keep_expected:
            expected[m] = got["target"]
        if "bad" in got:
            shape_bad.append(got["bad"])
            continue
        err, tn = got["err"], got["tn"]
        err_sq, tgt_sq = err_sq + err * err, tgt_sq + tn * tn
        rows[m] = got["row"]
        if "hint" in got:
            hints[m] = got["hint"]
        if "sn" in got:
            sn, mv = got["sn"], got["mv"]
            step_sq, moved = step_sq + sn * sn, moved + mv
    bad = list(hints)
    worst = max(rows, key=lambda m: rows[m]["rel_error"], default=None)
    figs = {"max_rel_error": rows[worst]["rel_error"] if worst else None, "worst_module": worst,
            **({"max_projected": max((r["projected"] for r in rows.values()), default=None)} if cut else {}),
            "rel_error": math.sqrt(err_sq / tgt_sq) if tgt_sq > 0 else math.sqrt(err_sq), "tolerance": tu,
            "compared_to": "recorded rank-cut error" if cut else "recomputed update"}
    if bad or shape_bad:
        m0 = bad[0] if bad else None
        detail = few(shape_bad, 3, "; ") if shape_bad else (
            f"{len(bad)}/{len(rows)} modules differ from the recomputed update, e.g. {m0}: "
            + (_cut_detail(rows[m0], rec.get(m0, {}).get("rel_error"), tu) if cut
               else f"relative error {rows[m0]['rel_error']:.3e} > {tu:g}"))
        scaled = f"scaled by {few(sorted({f'{h:.6g}' for h in hints.values() if h is not None}))}"
        config_changed = out.config_sha256 != (manifest.get("output") or {}).get("config_sha256")
        if bad and config_changed and all(h is not None for h in hints.values()):
            detail += (f"; the update is {scaled}: the scale PEFT applies (lora_alpha, r, alpha_pattern in "
                       f"{CONFIG_NAME}) changed")
        elif bad:
            detail += (f"; tensors of {few(bad)} in {out.weights_path.name} do not hold the recomputed factors"
                       + (f" ({scaled})" if all(h is not None for h in hints.values()) else ""))
        checks = [check("update", False, detail, {**figs, "bad_modules": bad})]
    else:
        checks = [check("update", True, f"every module within {tu:g} of the "
                        + ("recorded rank-cut error" if cut else "recomputed update (relative Frobenius)"), figs)]
    if ev.step is not None and not rows:  # every module unreadable or misshapen: nothing to measure the step on
        checks.append(check("step", False, f"no module was compared ({len(shape_bad)} could not be): the step's "
                            "survival is not measured", {"survival": None, "residual": None,
                                                         "tolerance": tol["survival"], "step_norm": None}))
    elif ev.step is not None:
        surv = moved / step_sq if step_sq > 0 else 1.0
        want = (manifest.get("figures") or {}).get("survival") if cut else 1.0
        if isinstance(want, bool) or not isinstance(want, (int, float)):
            want = math.nan  # an edited or removed figure: the check fails (and 'figures' names it)
        ts = tol["survival"]
        resid = math.sqrt(err_sq / step_sq) if step_sq > 0 else 0.0
        checks.append(check("step", within(abs(surv - want), ts),
                            f"survival {surv:.8f} (||W - I|| / ||step|| = {resid:.3e}), expected {want:.8f} "
                            f"within {ts:g}", {"survival": surv, "residual": resid, "tolerance": ts,
                                               "step_norm": math.sqrt(step_sq)}))
    if has_biases(ev) or out.bias_keys:
        checks.append(bias_check(out, ev, tu))
    return checks, expected if keep_expected else None


def _cut_detail(row: dict, recorded, tu: float) -> str:
    """Why a rank-cut module fails: W off its own projection of I, or its error not the recorded one."""
    if not within(row["projected"], tu):
        return f"||W - P_W I|| is {row['projected']:.3e} of ||I|| > {tu:g} (W is not I cut on its own column space)"
    return f"cut error recomputes to {row['rel_error']:.6e}, recorded {recorded!r} (tolerance {tu:g} either way)"


def bias_check(out: Adapter, ev, tu: float) -> dict:
    """The ``bias`` check: every module's written bias update against the recomputed one (see the docstring)."""
    errs = {}
    for m in ev.names:
        want = intended_bias(ev, m, ev.recipe.multiple)
        try:
            got = out.bias(m) if m in out.specs else None
        except VecmergeError:
            got = torch.full_like(want, math.nan)
        d = float(torch.linalg.norm((got if got is not None else torch.zeros_like(want)) - want))
        n = float(torch.linalg.norm(want))
        errs[m] = d / n if n > 0 else (0.0 if d == 0 else math.inf)
    bad = [m for m, e in errs.items() if not within(e, tu)]
    worst = max(errs, key=lambda k: errs[k], default=None)
    figs = {"max_rel_error": errs.get(worst), "worst_module": worst, "tolerance": tu, "modules": len(errs)}
    if bad:
        return check("bias", False, f"{len(bad)}/{len(errs)} modules: the lora_B.bias update differs from the "
                     f"recomputed bias, e.g. {bad[0]}: relative error {errs[bad[0]]:.3e} > {tu:g}", figs)
    return check("bias", True, f"every module's bias update (scale * lora_B.bias) within {tu:g} of the recomputed "
                 "one", figs)
