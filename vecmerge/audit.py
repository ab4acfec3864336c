"""Per-module agreement between a reference trajectory and a direction, measured against chance.

For modules m: ``inner_m = <ref_m, dir_m>_F`` (factored), ``cos_m = inner_m / (||ref_m|| ||dir_m||)``;
the module *agrees* when ``inner_m > 0``. ``agree_energy`` is the share of ``||dir||^2`` in agreeing modules.

**Chance level.** Unrelated updates of the same shapes and spectra are modelled as ``Q1 ref_m Q2^T``
with Haar-random orthogonal Q1 (out x out) and Q2 (in x in). With ``ref = U diag(s) V^T`` and
``dir = P diag(t) R^T``, the null cosine is ``sum_ij s_i t_j M1_ji M2_ji / (|s| |t|)`` where
``M1 = P^T Q1 U`` and ``M2 = R^T Q2 V`` are (k_dir x k_ref) blocks of Haar matrices; so it depends only
on the two spectra and (out, in). Analytic part (exact for every rank): ``E[O_ij O_kl] = d_ik d_jl / n``
for Haar O(n) gives ``E cos = 0`` and ``Var cos = 1 / (out * in)``, hence ``null_std = 1/sqrt(out in)``
(0.00057 for a 1024 x 3072 module) and ``z = cos / null_std``. The *shape* depends on the ranks:
excess kurtosis is about ``6 / (pr_ref * pr_dir)`` (pr = participation ratio ``(sum s^2)^2 / sum s^4``),
so two rank-1 updates give a heavy-tailed product-normal while rank-32 ones are Gaussian to a
fraction of a percent. The *sampled* band (``samples > 0``, the default) therefore draws the Haar
blocks exactly for the leading ``SAMPLE_RANK`` singular pairs of each side (Bartlett-Wishart +
Cholesky, O(k^3) per draw, never an out x in matrix) and adds the remaining pairs as a Gaussian of
exactly their variance; it is used to mark chance. Its Monte Carlo error is about 7% of the band
(one standard error) at 200 draws (seeded, so a report is reproducible); tests check it against dense random
rotations. ``samples=0`` uses the analytic band ``1.96 * null_std``. Both are two-sided at ``LEVEL``
(5%): a module is *chance* when ``|cos_m| < null_band_m``. The model assumes no structure shared by
unrelated updates; real adapters of one base model share input statistics, so read "significant"
as "beyond isotropic chance", not as proof.

**Whole adapter.** ``binom_p`` = one-sided binomial tail ``P(X >= agree)``, X ~ Bin(modules, 1/2):
it assumes the modules' signs are independent coin tosses, which layers trained together are not,
so it overstates the evidence. ``binom_p_significant`` repeats it over non-chance modules only.
``global_z = sum_m inner_m / sqrt(sum_m (||ref_m|| ||dir_m|| null_std_m)^2)`` (independent rotations).

**JSON** (``run_audit``; stable, keys are only ever added). ``kind: "audit"``, ``ref``, ``dir``,
``missing`` ({adapter name: [modules it lacks, counted as zero]}), ``summary``: ``modules, agree,
disagree, agree_energy, cosine_median, cosine_min, cosine_max, disagreeing`` (list of module names), ``chance,
agree_significant, disagree_significant, binom_p, binom_p_significant, global_inner, global_cosine,
global_z, null_method`` ("sampled"|"analytic"), ``samples, level``; ``rows``: one per module with
``module, layer`` (int|null), ``type, shape`` ([out, in]), ``inner, cosine, ref_norm, dir_norm, agree``
(bool), ``null_std, z, null_band, chance`` (bool), ``mark`` ("agree"|"disagree"|"chance").
Pairwise (``kind: "pairwise"``): ``pairwise``: ``labels``, ``modules``, ``norm`` (per label),
``cosine``, ``agree``, ``significant`` (label x label matrices: global cosine, modules with
``inner > 0``, modules with ``inner > 0`` and ``|z| >= 1.96``), and ``pairs``: one object per pair
``a, b, cosine, agree, significant, modules, cosine_median``.
"""

from __future__ import annotations

import math
import statistics
from fractions import Fraction

import numpy as np
import torch

from .adapter import module_layer, module_type
from .errors import VecmergeError
from .expr import parse
from .lowrank import COMPUTE_DTYPE, LowRank, f64
from .taskvector import TaskVector, align

LEVEL = 0.05
Z_CRIT = 1.959963984540054  # two-sided 5% normal quantile
SAMPLE_RANK = 32
SEED = 0


class AuditUsageError(VecmergeError):
    """``vecmerge audit`` called without a complete --ref/--dir pair or two adapters."""


def spectrum(x: LowRank) -> torch.Tensor:
    """Singular values of ``s B A`` from R factors only: ``B = Qb Rb, A^T = Qa Ra`` => ``sigma(s Rb Ra^T)``.

    Args:
        x (LowRank): B (out, r), A (r, in). Returns (min(r, out, in),) float64, descending.
    """
    if not isinstance(x, LowRank):  # an InSpan core (merge.evaluate): its own singular values
        return x.singular_values()
    if x.rank == 0 or x.scale == 0.0:
        return torch.zeros(0, dtype=COMPUTE_DTYPE)
    Rb = torch.linalg.qr(f64(x.B), mode="r").R
    Ra = torch.linalg.qr(f64(x.A).T, mode="r").R
    return torch.linalg.svdvals(abs(x.scale) * (Rb @ Ra.T)).cpu()


def _measure(ref: TaskVector, direction: TaskVector, names, progress):
    rows, spectra = [], []
    for m in progress(names) if progress else names:
        r, d = ref[m], direction[m]
        sr, sd = spectrum(r), spectrum(d)
        rn, dn = float(torch.linalg.vector_norm(sr)), float(torch.linalg.vector_norm(sd))
        inner = r.inner(d) if rn > 0 and dn > 0 else 0.0
        cos = inner / (rn * dn) if rn > 0 and dn > 0 else 0.0
        out, inn = d.shape
        rows.append({"module": m, "layer": module_layer(m), "type": module_type(m), "shape": [out, inn],
                     "inner": inner, "cosine": cos, "ref_norm": rn, "dir_norm": dn, "agree": inner > 0})
        spectra.append((sr, sd))
    return rows, spectra


def agreement_rows(ref: TaskVector, direction: TaskVector, names: list[str] | None = None,
                   progress=None) -> list[dict]:
    """One row per module: ``module, layer, type, shape, inner, cosine, ref_norm, dir_norm, agree``.

    ``inner = <ref_m, dir_m>_F``, ``cosine = inner / (||ref_m|| ||dir_m||)`` (0 where either is zero).

    Args:
        ref (TaskVector): the reference trajectory, e.g. ``v54 - v54e2``.
        direction (TaskVector): the proposed direction, e.g. ``v51 - v28``.
        names (list[str] | None): modules to audit (default: the direction's).
        progress: optional callable wrapping the module iterable (a tqdm bar).
    """
    return _measure(ref, direction, names if names is not None else direction.names(), progress)[0]


def haar_blocks(n: int, rows: int, cols: int, count: int, gen: torch.Generator,
                rng: np.random.Generator) -> torch.Tensor:
    """``count`` top-left (rows x cols) blocks of Haar-random orthogonal n x n matrices, in O(cols^3) each.

    A Haar frame is ``Q = G R^{-1}`` for Gaussian G (n x cols) with ``R^T R = G^T G``; its top rows are
    ``X R^{-1}`` with X the top rows of G, and ``G^T G = X^T X + W``, W ~ Wishart(n - rows, I_cols)
    drawn by Bartlett's decomposition (singular when n - rows < cols).

    Args:
        n (int): matrix size, ``n >= max(rows, cols)``. rows, cols, count (int): block shape and number.
    Returns:
        Tensor (count, rows, cols), float64 (normals drawn in float32, algebra in float64).
    """
    X = torch.randn(count, rows, cols, generator=gen).to(COMPUTE_DTYPE)
    df = n - rows
    idx = np.arange(cols)
    diag = np.sqrt(2.0 * rng.standard_gamma(np.maximum(df - idx, 0) / 2.0, size=(count, cols)))
    L = torch.tril(torch.randn(count, cols, cols, generator=gen).to(COMPUTE_DTYPE), -1)
    L = L * torch.as_tensor(idx < df, dtype=COMPUTE_DTYPE)  # singular Wishart: columns >= df vanish
    L = L + torch.diag_embed(torch.from_numpy(diag))
    C = torch.linalg.cholesky(X.transpose(1, 2) @ X + L @ L.transpose(1, 2))
    return torch.linalg.solve_triangular(C, X.transpose(1, 2), upper=False).transpose(1, 2)


def null_cosines(shapes: list, spectra: list, samples: int, seed: int = SEED,
                 rank: int = SAMPLE_RANK) -> list[torch.Tensor]:
    """Cosines of ``Q1 ref_m Q2^T`` with ``dir_m`` for random orthogonal Q1, Q2, per module.

    ``null = sum_{i,j<rank} s_i t_j M1_ji M2_ji / (|s| |t|) + sqrt(1 - sum_kept s^2 t^2 / (|s|^2 |t|^2)) g
    / sqrt(out in)``, g ~ N(0, 1): exact Haar blocks for the leading pairs, the rest Gaussian with exact
    variance. Modules of one shape share the Haar draws (common random numbers: each module's null is
    exact in distribution, their Monte Carlo errors are correlated); the cost is O(samples k^3) per shape.

    Args:
        shapes (list[tuple[int, int]]): (out, in) per module.
        spectra (list[tuple[Tensor, Tensor]]): (ref singular values, dir singular values) per module.
        samples (int): draws per module. seed (int): fixes the draws. rank (int): pairs sampled exactly.
    Returns:
        list of (samples,) float64 tensors, in module order (zeros where a side is zero).
    """
    gen, rng = torch.Generator().manual_seed(seed), np.random.default_rng(seed)
    out = [torch.zeros(samples, dtype=COMPUTE_DTYPE) for _ in shapes]
    groups: dict = {}
    for i, (shape, (sr, sd)) in enumerate(zip(shapes, spectra)):
        if len(sr) and len(sd) and float(sr.norm()) > 0 and float(sd.norm()) > 0:
            groups.setdefault(tuple(shape), []).append(i)
    for (n_out, n_in), idx in sorted(groups.items()):
        s = [spectra[i][0][:rank] / spectra[i][0].norm() for i in idx]
        t = [spectra[i][1][:rank] / spectra[i][1].norm() for i in idx]
        # share of |s|^2 |t|^2 outside the kept pairs, from the dropped tails (exactly 0 when nothing is dropped)
        ds, dt = (torch.tensor([float((spectra[i][side][rank:] ** 2).sum() / spectra[i][side].norm() ** 2)
                                for i in idx], dtype=COMPUTE_DTYPE) for side in (0, 1))
        k1, k2 = max(len(x) for x in s), max(len(x) for x in t)
        S = torch.stack([torch.nn.functional.pad(x, (0, k1 - len(x))) for x in s])  # (mods, k1)
        T = torch.stack([torch.nn.functional.pad(x, (0, k2 - len(x))) for x in t])  # (mods, k2)
        M = haar_blocks(n_out, k2, k1, samples, gen, rng) * haar_blocks(n_in, k2, k1, samples, gen, rng)
        kept = torch.einsum("mj,sji,mi->ms", T, M, S)
        rest = (ds + dt - ds * dt).clamp(min=0.0).sqrt()
        noise = torch.randn(len(idx), samples, generator=gen).to(COMPUTE_DTYPE) / math.sqrt(n_out * n_in)
        for j, i in enumerate(idx):
            out[i] = kept[j] + rest[j] * noise[j]
    return out


def mark_chance(rows: list[dict], spectra: list, samples: int = 200, seed: int = SEED) -> list[dict]:
    """Add ``null_std = 1/sqrt(out in)``, ``z = cos / null_std``, ``null_band``, ``chance``, ``mark`` to rows.

    ``null_band`` is the (1 - LEVEL) quantile of ``|null cosine|`` over ``samples`` draws
    (``null_cosines``), or ``Z_CRIT * null_std`` when ``samples == 0``; ``chance = |cos| < null_band``
    (always for a module where ref or dir is zero).

    Args:
        rows (list[dict]): from ``agreement_rows``, updated in place and returned.
        spectra (list[tuple[Tensor, Tensor]]): (ref, dir) singular values per row, from ``spectrum``.
        samples (int): draws per module; 0 for the analytic band. seed (int): fixes the draws.
    """
    if samples < 0:
        raise AuditUsageError(f"--samples {samples}: give 0 (analytic band) or a positive number of draws")
    nulls = null_cosines([r["shape"] for r in rows], spectra, samples, seed) if samples else None
    for i, r in enumerate(rows):
        std = 1.0 / math.sqrt(r["shape"][0] * r["shape"][1])
        band = Z_CRIT * std
        if nulls is not None and bool(nulls[i].abs().max() > 0):
            band = float(torch.quantile(nulls[i].abs(), 1.0 - LEVEL))
        live = r["ref_norm"] > 0 and r["dir_norm"] > 0
        chance = not live or abs(r["cosine"]) < band
        r.update(null_std=std, z=r["cosine"] / std, null_band=band, chance=chance,
                 mark="chance" if chance else ("agree" if r["agree"] else "disagree"))
    return rows


def binom_tail(k: int, n: int) -> float:
    """One-sided sign-test p-value ``P(X >= k)``, X ~ Binomial(n, 1/2), exact: ``sum_{j>=k} C(n,j) / 2^n``."""
    if n <= 0 or k <= 0:
        return 1.0
    return float(Fraction(sum(math.comb(n, j) for j in range(k, n + 1)), 2**n))


def summarize(rows: list[dict]) -> dict:
    """``modules, agree, disagree, agree_energy, cosine_median/min/max, disagreeing``, plus chance figures.

    ``agree_energy = sum_{agree} ||dir_m||^2 / sum ||dir_m||^2``. Chance figures (only when rows carry
    ``chance``): ``chance, agree_significant, disagree_significant, binom_p, binom_p_significant,
    global_inner, global_cosine, global_z`` (see the module docstring).

    Args:
        rows (list[dict]): from ``agreement_rows`` (and ``mark_chance``).
    """
    energy = sum(r["dir_norm"] ** 2 for r in rows)
    agree_energy = sum(r["dir_norm"] ** 2 for r in rows if r["agree"])
    cos = [r["cosine"] for r in rows]
    agree = sum(bool(r["agree"]) for r in rows)
    out = {
        "modules": len(rows),
        "agree": agree,
        "disagree": len(rows) - agree,
        "agree_energy": agree_energy / energy if energy > 0 else 0.0,
        "cosine_median": statistics.median(cos) if cos else 0.0,
        "cosine_min": min(cos) if cos else 0.0,
        "cosine_max": max(cos) if cos else 0.0,
        "disagreeing": [r["module"] for r in rows if not r["agree"]],
    }
    if rows and "chance" in rows[0]:
        sig_a = sum(r["mark"] == "agree" for r in rows)
        sig_d = sum(r["mark"] == "disagree" for r in rows)
        inner = sum(r["inner"] for r in rows)
        rn = math.sqrt(sum(r["ref_norm"] ** 2 for r in rows))
        dn = math.sqrt(energy)
        var = sum((r["ref_norm"] * r["dir_norm"] * r["null_std"]) ** 2 for r in rows)
        out.update(chance=len(rows) - sig_a - sig_d, agree_significant=sig_a, disagree_significant=sig_d,
                   binom_p=binom_tail(agree, len(rows)), binom_p_significant=binom_tail(sig_a, sig_a + sig_d),
                   global_inner=inner, global_cosine=inner / (rn * dn) if rn > 0 and dn > 0 else 0.0,
                   global_z=inner / math.sqrt(var) if var > 0 else 0.0)
    return out


def _vectors(ws, exprs: list[str], allow_missing: bool):
    """Evaluate and align expressions; missing modules become zeros and are listed per adapter name."""
    vecs = [ws.evaluate(e, allow_missing) for e in exprs]
    names = align(vecs, exprs, allow_missing)
    shapes = {m: next(v[m].shape for v in vecs if m in v.modules) for m in names}
    adapters = dict.fromkeys(n for e in exprs for n in parse(e).names())
    missing = {n: [m for m in names if m not in ws.adapter(n).specs] for n in adapters}
    full = [TaskVector({m: v.modules.get(m) or LowRank.zeros(shapes[m]) for m in names}, v.specs) for v in vecs]
    return full, names, {n: ms for n, ms in missing.items() if ms}


def pairwise(vectors: list[TaskVector], labels: list[str], names: list[str], progress=None) -> dict:
    """Global cosines and per-module agreement counts between every pair of task vectors.

    ``cosine[a][b] = sum_m <a_m, b_m> / (||a|| ||b||)``; ``agree[a][b] = #{m: <a_m, b_m> > 0}``;
    ``significant[a][b]`` also needs ``|cos_m| >= 1.96 / sqrt(out in)`` (analytic band).

    Args:
        vectors (list[TaskVector]): aligned, every module present. labels (list[str]): their names.
    """
    k = len(vectors)
    norms = [[0.0] * len(names) for _ in vectors]
    inner = {(a, b): [0.0] * len(names) for a in range(k) for b in range(a, k)}
    for j, m in enumerate(progress(names) if progress else names):
        for a in range(k):
            norms[a][j] = float(torch.linalg.vector_norm(spectrum(vectors[a][m])))
            for b in range(a, k):
                inner[a, b][j] = norms[a][j] ** 2 if a == b else vectors[a][m].inner(vectors[b][m])
    std = [1.0 / math.sqrt(vectors[0][m].shape[0] * vectors[0][m].shape[1]) for m in names]
    total = [math.sqrt(sum(x * x for x in n)) for n in norms]
    cos_m = {}
    cosine = [[0.0] * k for _ in range(k)]
    agree = [[0] * k for _ in range(k)]
    sig = [[0] * k for _ in range(k)]
    for (a, b), ips in inner.items():
        cs = [ip / (norms[a][j] * norms[b][j]) if norms[a][j] * norms[b][j] > 0 else 0.0 for j, ip in enumerate(ips)]
        cos_m[a, b] = cs
        g = sum(ips) / (total[a] * total[b]) if total[a] * total[b] > 0 else 0.0
        n_agree = sum(ip > 0 for ip in ips)
        n_sig = sum(ip > 0 and abs(c) >= Z_CRIT * s for ip, c, s in zip(ips, cs, std))
        cosine[a][b] = cosine[b][a] = g
        agree[a][b] = agree[b][a] = n_agree
        sig[a][b] = sig[b][a] = n_sig
    pairs = [{"a": labels[a], "b": labels[b], "cosine": cosine[a][b], "agree": agree[a][b],
              "significant": sig[a][b], "modules": len(names),
              "cosine_median": statistics.median(cos_m[a, b]) if names else 0.0}
             for a in range(k) for b in range(a + 1, k)]
    return {"labels": list(labels), "modules": len(names), "norm": total, "cosine": cosine, "agree": agree,
            "significant": sig, "pairs": pairs}


def run_audit(ws, ref: str | None = None, direction: str | None = None, adapters: list | None = None,
              allow_missing: bool = False, samples: int = 200, progress=None) -> dict:
    """``vecmerge audit``: per-module agreement of ``ref`` and ``direction``, or pairwise over ``adapters``.

    Args:
        ws (Workspace): resolves names. ref, direction (str | None): expressions, given together.
        adapters (list[str] | None): two or more expressions for the pairwise matrix.
        allow_missing (bool): missing modules count as zero. samples (int): draws for the chance band (0: analytic).
        progress: optional callable wrapping the module iterable.
    Returns:
        A JSON-ready dict (schema in the module docstring).
    """
    adapters = list(adapters or [])
    if (ref is None) != (direction is None):
        given, lacking = ("--ref", "--dir") if ref is not None else ("--dir", "--ref")
        raise AuditUsageError(f"audit: {given} needs {lacking} too; e.g. --ref 'v54 - v54e2' --dir 'v51 - v28'")
    if ref is not None and adapters:
        raise AuditUsageError("audit: give either --ref/--dir or ADAPTERS for a pairwise matrix, not both")
    if ref is None and len(adapters) < 2:
        what = f"only one adapter ({adapters[0]})" if adapters else "nothing to audit"
        raise AuditUsageError(f"audit: {what}; pass --ref EXPR --dir EXPR, or two or more ADAPTERS to compare")
    if samples < 0:
        raise AuditUsageError(f"--samples {samples}: give 0 (analytic band) or a positive number of draws")
    if ref is None:
        vecs, names, missing = _vectors(ws, adapters, allow_missing)
        res = pairwise(vecs, adapters, names, progress)
        return {"kind": "pairwise", "missing": missing, "pairwise": {k: v for k, v in res.items() if k != "pairs"},
                "pairs": res["pairs"]}
    (rv, dv), names, missing = _vectors(ws, [ref, direction], allow_missing)
    rows, spectra = _measure(rv, dv, names, progress)
    mark_chance(rows, spectra, samples)
    summary = summarize(rows)
    summary.update(null_method="sampled" if samples else "analytic", samples=samples, level=LEVEL)
    return {"kind": "audit", "ref": ref, "dir": direction, "missing": missing, "summary": summary, "rows": rows}
