"""Per-module sign consensus between a reference trajectory and a direction, and the gate built on it.

For modules m: ``inner_m = <ref_m, dir_m>_F`` (factored), ``cos_m = inner_m / (||ref_m|| ||dir_m||)``
with norms from the singular values; the module *agrees* when ``inner_m > 0``. A module that is zero on
either side (exactly, or within round-off: ``||x|| <= EXACT_RTOL * floor``, the rule by which an exact
rank cut gives it rank 0) has no sign: it is marked ``zero`` and, like a missing one, not compared. ``agree_energy`` is
the share of ``||dir||^2`` in agreeing modules. ``audit`` adds the chance band to these rows;
``project``'s consensus gate (``apply_on_disagree``) fails, drops or keeps the disagreeing modules.
This is the one place consensus is computed: the audit, the gate and the mask all read these rows.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from fractions import Fraction

import torch

from ..errors import CheckFailed, ExpressionError, few
from ..linalg.lowrank import EXACT_RTOL, LowRank, f64
from ..peft.format import module_layer, module_types


def roundoff_floor(x) -> float:
    """The round-off scale of a module: ``|s| ||B||_F ||A||_F`` of a LowRank's factors, ``InSpan.floor`` of a core."""
    if isinstance(x, LowRank):
        return abs(x.scale) * float(torch.linalg.norm(f64(x.B))) * float(torch.linalg.norm(f64(x.A)))
    return float(x.floor)


def is_zero(x, norm: float) -> bool:
    """Whether a module of Frobenius norm ``norm`` is zero: ``norm <= EXACT_RTOL * floor`` (``roundoff_floor``),
    which holds for ``norm == 0``; a cancellation such as ``v - v`` leaves round-off of about 1e-16 of its
    terms, with no meaningful sign."""
    return norm <= EXACT_RTOL * roundoff_floor(x)


def measure(ref, direction, names, progress=None, spectra: bool = True) -> tuple[list[dict], list[tuple]]:
    """Rows (see ``agreement_rows``) and each module's (ref, dir) singular values.

    Args:
        ref, direction (TaskVector): of LowRank or InSpan modules, aligned. names (list[str]): modules.
        progress: optional callable wrapping the module iterable (a tqdm bar).
        spectra (bool): compute the singular values (the audit's chance band needs them; then the norms
            are their root sum of squares); without, the norms are ``x.norm()`` and the list is empty.
    """
    rows, spec_list = [], []
    specs = getattr(direction, "specs", None) or {}
    types = module_types(names, specs)
    for m in progress(names) if progress else names:
        r, d = ref[m], direction[m]
        if spectra:
            sr, sd = r.singular_values(), d.singular_values()
            rn, dn = float(torch.linalg.vector_norm(sr)), float(torch.linalg.vector_norm(sd))
            spec_list.append((sr, sd))
        else:
            rn, dn = r.norm(), d.norm()
        zero = is_zero(r, rn) or is_zero(d, dn)
        inner = r.inner(d) if not zero else 0.0
        cos = inner / (rn * dn) if not zero else 0.0
        out, inn = d.shape
        spec = specs.get(m)
        expert = spec.expert if spec is not None else None
        row = {"module": m, "layer": module_layer(m), "type": types[m], "shape": [out, inn],
               "inner": inner, "cosine": cos, "ref_norm": rn, "dir_norm": dn, "agree": inner > 0}
        if zero:  # no sign to compare: counted apart, like a missing module
            row["zero"] = True
        if expert is not None:  # one row per expert; ``type`` is the parameter (gate_up_proj), pooled in the grid
            row["expert"] = expert
        rows.append(row)
    return rows, spec_list


def agreement_rows(ref, direction, names: list[str] | None = None, progress=None) -> list[dict]:
    """One row per module: ``module, layer, type, shape, inner, cosine, ref_norm, dir_norm, agree``.

    An expert of a MoE parameter (``ModuleSpec.expert``) is a module too; its row adds ``expert`` and its
    ``type`` is the parameter (``gate_up_proj``).

    ``inner = <ref_m, dir_m>_F``, ``cosine = inner / (||ref_m|| ||dir_m||)``; where either side is zero
    (``is_zero``) both are 0 and the row has ``zero: True``.

    Args:
        ref (TaskVector): the reference trajectory, e.g. ``v54 - v54e2``.
        direction (TaskVector): the proposed direction, e.g. ``v51 - v28``.
        names (list[str] | None): modules to audit (default: the direction's).
        progress: optional callable wrapping the module iterable (a tqdm bar).
    """
    return measure(ref, direction, names if names is not None else direction.names(), progress, spectra=False)[0]


def check_not_zero(rows: list[dict], ref_expr: str, dir_expr: str | None = None, *, ref_flag: str = "--ref") -> None:
    """ExpressionError (exit 2) when the reference (or, given ``dir_expr``, the direction) is zero in every
    compared module: signs of zero say nothing, so no module can agree (``v54 - v54`` is a typo, not evidence).

    Args:
        rows (list[dict]): ``agreement_rows`` (rows marked ``missing`` are not compared).
        ref_expr (str): the reference expression. dir_expr (str | None): the direction's, to check it too.
        ref_flag (str): how the user named the reference (``--ref``, ``--consensus-ref``).
    """
    counted = [r for r in rows if not r.get("missing")]
    for expr, key, flag in ((ref_expr, "ref_norm", ref_flag), (dir_expr, "dir_norm", "--dir")):
        if expr is not None and counted and all(r[key] == 0 for r in counted):
            raise ExpressionError(f"{flag} {expr}: is zero in every module (the expression cancels), so there is "
                                  "no sign to agree with; check it, e.g. v54 - v54e2")


def binom_tail(k: int, n: int) -> float:
    """One-sided sign-test p-value ``P(X >= k)``, X ~ Binomial(n, 1/2), exact: ``sum_{j>=k} C(n,j) / 2^n``.

    1 for ``k <= 0``, 0 for ``k > n`` (n = 0 included). Args: k (int): successes. n (int): trials, ``n >= 0``.
    """
    if k <= 0:
        return 1.0
    return float(Fraction(sum(math.comb(n, j) for j in range(k, n + 1)), 2**n))


def summarize(rows: list[dict]) -> dict:
    """``modules, agree, disagree, agree_energy, cosine_median/min/max, disagreeing``, plus chance figures.

    ``agree`` counts *sign agreement* (``inner_m > 0``); ``agree_energy = sum_{agree} ||dir_m||^2 /
    sum ||dir_m||^2``. Rows marked ``missing`` (a module some input lacks, read as zero by
    ``--allow-missing``) and rows marked ``zero`` (a module zero on either side: no sign) are not
    compared: they are counted in ``not_compared`` (``zero`` of them zero) and left out of every
    per-module figure (counts, energy share, cosine median/min/max, sign tests), so
    ``agree + disagree + not_compared = modules``. Chance figures (only when rows carry ``chance``,
    see ``audit.mark_chance``): ``chance, agree_significant, disagree_significant`` (agreement
    *beyond chance*), ``binom_p, binom_p_significant``, and the whole-vector ``global_inner,
    global_cosine, global_z`` (over every module, missing ones as zero).

    Args:
        rows (list[dict]): from ``agreement_rows`` (and ``audit.mark_chance``).
    """
    counted = [r for r in rows if not r.get("missing") and not r.get("zero")]
    energy = sum(r["dir_norm"] ** 2 for r in counted)
    agree_energy = sum(r["dir_norm"] ** 2 for r in counted if r["agree"])
    cos = [r["cosine"] for r in counted]
    agree = sum(bool(r["agree"]) for r in counted)
    out = {
        "modules": len(rows),
        "agree": agree,
        "disagree": len(counted) - agree,
        "agree_energy": agree_energy / energy if energy > 0 else 0.0,
        "cosine_median": statistics.median(cos) if cos else 0.0,
        "cosine_min": min(cos) if cos else 0.0,
        "cosine_max": max(cos) if cos else 0.0,
        "disagreeing": [r["module"] for r in counted if not r["agree"]],
        "not_compared": len(rows) - len(counted),
        "zero": sum(bool(r.get("zero")) and not r.get("missing") for r in rows),
    }
    if rows and "chance" in rows[0]:
        sig_a = sum(r["mark"] == "agree" for r in counted)
        sig_d = sum(r["mark"] == "disagree" for r in counted)
        inner = sum(r["inner"] for r in rows)
        rn = math.sqrt(sum(r["ref_norm"] ** 2 for r in rows))
        dn = math.sqrt(sum(r["dir_norm"] ** 2 for r in rows))
        var = sum((r["ref_norm"] * r["dir_norm"] * r["null_std"]) ** 2 for r in rows)
        out.update(chance=len(counted) - sig_a - sig_d, agree_significant=sig_a, disagree_significant=sig_d,
                   binom_p=binom_tail(agree, len(counted)), binom_p_significant=binom_tail(sig_a, sig_a + sig_d),
                   global_inner=inner, global_cosine=inner / (rn * dn) if rn > 0 and dn > 0 else 0.0,
                   global_z=inner / math.sqrt(var) if var > 0 else 0.0)
    return out


@dataclass(frozen=True)
class ConsensusResult:
    """The gate's verdict on a direction.

    Args:
        ref (str): the reference expression. on_disagree (str): fail | drop | keep.
        min_agree (float | None): the required share of agreeing modules.
        summary (dict): ``summarize(rows)``. rows (list[dict]): ``agreement_rows``.
        dropped (tuple[str]): modules zeroed in the direction (``on_disagree: drop``).
    """

    ref: str
    on_disagree: str
    min_agree: float | None
    summary: dict
    rows: list
    dropped: tuple = ()

    def to_dict(self) -> dict:
        """The JSON form reports and manifests carry: settings, the summary figures and the rows."""
        return {"ref": self.ref, "on_disagree": self.on_disagree, "min_agree": self.min_agree,
                **self.summary, "rows": self.rows}


def apply_on_disagree(ref_expr: str, rows: list[dict], on_disagree: str,
                      min_agree: float | None) -> ConsensusResult:
    """Apply the on-disagree policy (project's consensus gate): CheckFailed (exit 1) below ``min_agree`` or on
    any disagreement with ``fail``.

    ``share = agree / (modules - zero)`` must be at least ``min_agree`` (a module zero on either side has no
    sign and is left out; a missing one counts against); with ``on_disagree: drop`` the
    disagreeing modules are returned as ``dropped``; with ``keep`` nothing changes.

    Args:
        ref_expr (str): the reference, for messages. rows (list[dict]): ``agreement_rows``.
        on_disagree (str): fail | drop | keep. min_agree (float | None): share in [0, 1].
    """
    check_not_zero(rows, ref_expr, ref_flag="--consensus-ref")
    summary = summarize(rows)
    signed = summary["modules"] - summary["zero"]  # a module zero on either side has no sign to agree with
    share = summary["agree"] / signed if signed else 0.0
    if summary["modules"] and not signed:
        raise CheckFailed(f"consensus: every module is zero (within round-off) in {ref_expr} or in the direction: "
                          "no sign to compare; nothing written (choose another --consensus-ref)")
    bad = summary["disagreeing"]
    if min_agree is not None and share < min_agree:
        raise CheckFailed(f"consensus: {summary['agree']}/{signed} modules agree "
                          f"({share:.1%}) < min_agree {min_agree:g}; disagreeing: {few(bad)}")
    if bad and on_disagree == "fail":
        raise CheckFailed(f"consensus: {len(bad)}/{summary['modules']} module(s) disagree with "
                          f"{ref_expr}: {few(bad)}; nothing written (use --on-disagree drop|keep)")
    dropped = tuple(bad) if on_disagree == "drop" else ()
    return ConsensusResult(ref_expr, on_disagree, min_agree, summary, rows, dropped)
