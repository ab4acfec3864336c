"""``verify``'s ``independent`` check: the written update against verify's own derivation of the intended one.

Per module m, with W the update read back by ``verify.independent.lora_terms`` and I the intended update from
``verify.independent.derive`` (both float64 factors, no pipeline code), and X a block of ``PROBES`` Gaussian probe
vectors drawn from a seed that is the output's sha256 and the module's name (a change cannot be aimed at
the probes: they change with every byte of the file):

- lossless output (rank ``exact``): ``||W X - I X|| / ||I X|| <= tol`` (``tol`` the dtype's ``update``
  tolerance of ``outputs.manifest.TOLERANCES``). ``E||M X||^2 = PROBES ||M||_F^2`` for any M, and the
  probability that a change of relative size e reads below e / 4 is below 1e-8 for 16 probes (chi-square
  with 16 degrees of freedom under 1), so a scale of 1.0003 on one factor (e = 3e-4) fails fp32's 1e-5;
- rank-cut output: W must be I projected on W's own column space, ``W = Q Q^T I`` (Q an orthonormal basis
  of W's columns): ``||W X - Q Q^T I X|| / ||I X|| <= tol``, which every optimal cut (and every range-finder
  cut) satisfies and any rescaled, rotated or edited factor breaks; its error ``||I - W||`` (Grams) must
  reproduce the recorded ``modules[m].rel_error`` within tol and be optimal for its rank,
  ``||I - W||^2 <= sum_{j > k} sigma_j(I)^2 + (tol ||I||)^2`` (sigma from the R factors of I's stack): with a
  tie in the spectrum any optimal cut passes, since only errors are compared there; a range-finder cut (the
  manifest's ``cut: randomized``, dense-space merges) is near-optimal, not exactly: within ``RANGE_FINDER_SLACK``
  (1%) of the optimal error;
- a step (``project``): ``survival = sum_m <W_m - base_m, step_m> / sum_m ||step_m||^2`` within the dtype's
  ``survival`` tolerance of 1 (of the recorded figure for a rank-cut output); the recorded alpha (``k alpha``),
  realized step, consensus drops and modules without a step as recomputed.

Cost per module: ``O((out + in) R (R + PROBES))`` for a stack of R columns; one module's factors in memory (a
dense-space merge: its dense (out, in) result, ``O(out in min(out, in))`` for the optimal error's SVD).
"""

from __future__ import annotations

import hashlib
import math
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from ...errors import few
from ..report import check, close, within
from .derive import Derivation, Stack, derive
from .lora_terms import read_folder

PROBES = 16
ALPHA_RTOL = 1e-9         # alpha is a ratio of float64 norms
REALIZED_RTOL = 1e-7      # the realized step from the same norms, summed in another order
RANGE_FINDER_SLACK = 1e-2  # a randomized (range-finder) cut's error may exceed the optimal one by this share
PROTECTED_RTOL = 1e-6     # a protected step's alpha: ||D'|| rests on U from a float32 forward (captured item by item)
ERROR_RTOL = 1e-2         # the recorded write or cut error, recomputed ||W - I|| / ||I||: to 1% of itself ...
ERROR_FLOOR = 3e-7        # ... or within 5 float32 ulps (a 0.0001 edit of one entry moves a module's error ~1e-6)


def _probes(seed_text: str, n: int) -> np.ndarray:
    seed = int(hashlib.sha256(seed_text.encode()).hexdigest()[:16], 16)
    return np.random.default_rng(seed).standard_normal((n, PROBES))


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else (0.0 if a == 0 else math.inf)


def compare_module(m: str, d: Derivation, out, seed: str, cut: bool) -> dict:
    """Module m's figures: ``diff`` (probe residual), ``rel_error`` (cut: Gram), ``optimal``, survival terms."""
    intended, base, step = d.intended(m)
    Bw, Aw = out.factors(m)
    W = Stack(Bw, Aw)
    X = _probes(seed + m, Aw.shape[1])
    IX, WX = intended.apply(X), W.apply(X)
    nI = float(np.linalg.norm(IX))
    row = {"rank": Aw.shape[0]}
    if cut:
        Q = np.linalg.qr(Bw)[0] if Bw.shape[1] else np.zeros((Bw.shape[0], 0))
        row["diff"] = _ratio(float(np.linalg.norm(WX - Q @ (Q.T @ IX))), nI)
        sq_i = intended.norm() ** 2
        err_sq = max(sq_i - 2 * intended.inner(W) + W.inner(W), 0.0)
        sigma = intended.singular_values()
        row.update(rel_error=_ratio(math.sqrt(err_sq), math.sqrt(sq_i)),
                   optimal=_ratio(math.sqrt(float(np.sum(sigma[row["rank"]:] ** 2))), math.sqrt(sq_i)))
    else:
        row["diff"] = _ratio(float(np.linalg.norm(WX - IX)), nI)
        gap = Stack(np.hstack([intended.B, -Bw]), np.vstack([intended.A, Aw]))  # bound 0: the stable R factors
        row["rel_error"] = _ratio(gap.norm(), intended.norm())
    want_b = d.intended_bias(m)
    got_b = out.bias(m) if m in out.bias_keys else None
    if want_b is not None or got_b is not None:  # lora_bias: exact (a vector, never cut)
        want_v = want_b if want_b is not None else np.zeros(Bw.shape[0])
        got_v = got_b if got_b is not None else np.zeros(Bw.shape[0])
        row["bias"] = _ratio(float(np.linalg.norm(got_v - want_v)), float(np.linalg.norm(want_v)))
    if step is not None and base is not None:
        row["moved"] = W.inner(step) - base.inner(step)
        row["step_sq"] = (d.module_alpha[m] * d.dir_norms[m]) ** 2  # the norms of pass 1, not a second QR
    return row


def independent_check(path: Path, manifest: dict, tol: dict, threads: int = 2, protector=None, after=None) -> dict:
    """The ``independent`` check of the output at ``path`` (manifest inputs at absolute paths); raises
    ``Uncovered`` for a recipe verify's own path does not cover, for the caller to name (see ``derive``;
    ``protector``: a protected step's ``{module: U}``, ``protected``; ``after(d)``: called on the derivation
    before it closes)."""
    d = derive(manifest, protector)
    out = read_folder(Path(path))
    try:
        row = _check(d, out, manifest, tol, threads)
        if after is not None:
            after(d)
        return row
    finally:
        d.close()
        out.close()


def _check(d: Derivation, out, manifest: dict, tol: dict, threads: int) -> dict:
    """The comparison of ``independent_check`` on a derivation and the output, both open."""
    problems = list(d.problems)
    written, want = set(out.keys), set(d.names)
    if written != want:
        problems.append(f"the output holds modules [{few(sorted(written - want))}] it should not and lacks "
                        f"[{few(sorted(want - written))}]")
    cut = d.rank not in ("exact", "keep-base")  # keep-base: the backbone's factors and the step's exact ones
    names = [m for m in d.names if m in written]
    def one(m: str) -> dict:
        with np.errstate(over="raise", invalid="raise", divide="raise"):  # per thread: errstate is thread-local
            return compare_module(m, d, out, out.sha256, cut)

    with ThreadPoolExecutor(max(1, threads)) as pool:
        rows = dict(zip(names, pool.map(one, names)))
    tu, ts = tol["update"], tol["survival"]
    rec = manifest.get("modules") or {}
    off = [m for m, r in rows.items() if not within(r["diff"], tu)]
    if off:
        problems.append(f"{len(off)}/{len(rows)} modules do not hold the intended update, e.g. {off[0]}: "
                        f"{'W - QQ^T I' if cut else 'W - I'} is {rows[off[0]]['diff']:.3e} of I on {PROBES} probes "
                        f"> {tu:g}")
    biased = {m: r["bias"] for m, r in rows.items() if "bias" in r}
    off_b = [m for m, e in biased.items() if not within(e, tu)]
    if off_b:
        problems.append(f"{len(off_b)}/{len(biased)} modules do not hold the intended bias update (scale * "
                        f"lora_B.bias), e.g. {off_b[0]}: relative error {biased[off_b[0]]:.3e} > {tu:g}")
    def reproduces(r: dict, recorded) -> bool:
        """The written error ||W - I|| / ||I|| as the manifest records it: to ERROR_RTOL of itself, or within
        ERROR_FLOOR (a few float32 ulps: the pipeline's I and verify's differ by round-off only)."""
        return isinstance(recorded, (int, float)) and not isinstance(recorded, bool) and within(
            abs(r["rel_error"] - recorded), ERROR_RTOL * max(r["rel_error"], recorded) + ERROR_FLOOR)

    bad_err = [m for m, r in rows.items() if "rel_error" in r and (cut or "rel_error" in (rec.get(m) or {}))
               and not reproduces(r, (rec.get(m) or {}).get("rel_error"))]
    if bad_err:
        m = bad_err[0]
        problems.append(f"the recorded {'cut' if cut else 'write'} error differs in {len(bad_err)} module(s), e.g. "
                        f"{m}: recomputed {rows[m]['rel_error']:.6e}, recorded "
                        f"{(rec.get(m) or {}).get('rel_error')!r}")
    if cut:
        def bound(m: str, r: dict) -> float:
            exact = math.hypot(r["optimal"], tu)
            randomized = (rec.get(m) or {}).get("cut") == "randomized"
            return max(exact, r["optimal"] * (1 + RANGE_FINDER_SLACK)) if randomized else exact

        worse = [m for m, r in rows.items() if not within(r["rel_error"], bound(m, r))]
        if worse:
            m = worse[0]
            problems.append(f"{len(worse)} module(s) are not an optimal cut for their rank, e.g. {m}: error "
                            f"{rows[m]['rel_error']:.6e} > optimal {rows[m]['optimal']:.6e}")
        if d.rank.isdigit():
            over = [m for m, r in rows.items() if r["rank"] > int(d.rank)]
            if over:
                problems.append(f"rank {d.rank} exceeded in {few(over)}")
    figs = {"modules": len(rows), "probes": PROBES, "max_diff": max((r["diff"] for r in rows.values()), default=0.0),
            "tolerance": tu}
    if d.kind == "project":
        problems += _step_problems(d, manifest, rows, cut, ts, figs)
    what = "its optimal cut" if cut else "the intended update"
    return check("independent", not problems, "; ".join(problems) or
                 f"re-derived by verify's own float64 path (no pipeline code): every module is {what} within "
                 f"{tu:g} on {PROBES} probes" + (", the recorded cut errors reproduce" if cut else "")
                 + (f"; alpha {figs['alpha']!r} as recorded" if figs.get("alpha") is not None else "")
                 + (f"; the lora_bias bias updates of {len(biased)} modules within {tu:g}" if biased else ""), figs)


def _step_problems(d: Derivation, manifest: dict, rows: dict, cut: bool, ts: float, figs: dict) -> list[str]:
    """The step's figures against the manifest: alpha, realized step, drops, survival."""
    res, problems = manifest.get("resolved") or {}, []
    rtol = PROTECTED_RTOL if d.protect else ALPHA_RTOL
    if d.alpha is not None:
        figs["alpha"] = d.alpha
        if not isinstance(res.get("alpha"), (int, float)) or not close(d.alpha, res["alpha"], rtol, 0):
            problems.append(f"alpha (k * alpha) recomputes to {d.alpha!r}, the manifest records {res.get('alpha')!r}")
    else:
        rec = res.get("module_alpha") or {}
        off = [m for m, a in d.module_alpha.items()
               if not isinstance(rec.get(m), (int, float)) or not close(a, rec[m], rtol, 0)]
        if off:
            problems.append(f"module alpha differs from the manifest's in {few(off)}")
    realized = (res.get("realized") or {}).get("global")
    if d.realized is not None and (not isinstance(realized, (int, float))
                                   or not close(d.realized, realized, max(rtol, REALIZED_RTOL), 0)):
        problems.append(f"the realized step recomputes to {d.realized!r}, the manifest records {realized!r}")
    for key, mine in (("dropped_by_consensus", d.dropped), ("zeroed_by_method", [m for m in d.zeroed
                                                                                 if m not in d.dropped])):
        if key in res and sorted(res[key] or []) != sorted(mine):
            problems.append(f"{key}: recomputed [{few(sorted(mine))}], recorded [{few(sorted(res[key] or []))}]")
    step_sq = sum(r.get("step_sq", 0.0) for r in rows.values())
    if step_sq > 0:
        surv = sum(r["moved"] for r in rows.values()) / step_sq
        want = (manifest.get("figures") or {}).get("survival") if cut else 1.0
        figs["survival"] = surv
        if isinstance(want, bool) or not isinstance(want, (int, float)) or not within(abs(surv - want), ts):
            problems.append(f"survival {surv:.8f}, expected {want!r} within {ts:g}")
    return problems

