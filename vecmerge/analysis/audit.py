"""Per-module agreement between a reference trajectory and a direction, measured against chance.

    inner_m = <ref_m, dir_m>_F (factored)    cos_m = inner_m / (||ref_m|| ||dir_m||)    agrees: inner_m > 0
    null_std_m = 1 / sqrt(out * in)          z_m = cos_m / null_std_m                  chance: |cos_m| < null_band_m
    global_z = sum_m inner_m / sqrt(sum_m (||ref_m|| ||dir_m|| null_std_m)^2)

``null_band`` is sampled (Haar blocks on the leading singular pairs, seeded; the default) or analytic
(``1.96 * null_std``), two-sided at ``LEVEL``. ``binom_p`` is the one-sided binomial tail of the agreeing
modules over Bin(modules, 1/2). A module some input lacks (``--allow-missing``) is marked ``missing`` and
not compared. ``audit_trajectories`` and ``audit_pairwise`` return typed results whose JSON keys are only
ever added. The null model, its limits and the JSON keys: docs/design/analysis.md.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

import numpy as np
import torch

from ..errors import VecmergeError
from ..expr import parse
from ..linalg.lowrank import COMPUTE_DTYPE, LowRank, check_magnitude
from ..results import Result, json_meta
from ..workspace.inputs import open_inputs
from ..workspace.taskvector import TaskVector
from .consensus import check_not_zero, measure, summarize

LEVEL = 0.05
Z_CRIT = 1.959963984540054  # two-sided 5% normal quantile
SAMPLE_RANK = 32
SEED = 0


@dataclass(frozen=True, eq=False)
class AuditReport(Result):
    """``vecmerge audit --ref R --dir D``: per-module agreement (``--json``: ``to_dict()``, schema above).

    Args:
        ref, direction (str): the two expressions (``direction`` is JSON ``dir``).
        missing (dict): ``{input: [modules it lacks]}``. summary (dict): counts, cosines, the sign test, the band.
        rows (list[dict]): one per module (``inner``, ``cosine``, ``agree``, ``mark``, ...).
        base_models (dict): each input's declared base model. base_models_differ (bool).
    """

    kind: str = field(default="audit", kw_only=True)  # first in the JSON
    ref: str
    direction: str = field(metadata=json_meta("dir"))
    missing: dict
    summary: dict
    rows: list
    base_models: dict
    base_models_differ: bool


@dataclass(frozen=True, eq=False)
class PairwiseReport(Result):
    """``vecmerge audit A B C...``: global cosines and per-module agreement of every pair (``to_dict()``).

    Args:
        missing (dict): ``{input: [modules it lacks]}``. pairwise (dict): labels, modules, norms and the
            cosine / agree / significant / compared matrices. pairs (list[dict]): one row per pair.
        base_models (dict), base_models_differ (bool): as for ``AuditReport``.
    """

    kind: str = field(default="pairwise", kw_only=True)  # first in the JSON
    missing: dict
    pairwise: dict
    pairs: list
    base_models: dict
    base_models_differ: bool


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
        spectra (list[tuple[Tensor, Tensor]]): (ref, dir) singular values per row, from ``consensus.measure``.
        samples (int): draws per module; 0 for the analytic band. seed (int): fixes the draws.
    """
    if samples < 0:
        raise VecmergeError(f"samples={samples}: give 0 (analytic band) or a positive number of draws")
    nulls = null_cosines([r["shape"] for r in rows], spectra, samples, seed) if samples else None
    for i, r in enumerate(rows):
        std = 1.0 / math.sqrt(r["shape"][0] * r["shape"][1])
        band = Z_CRIT * std
        if nulls is not None and bool(nulls[i].abs().max() > 0):
            band = float(torch.quantile(nulls[i].abs(), 1.0 - LEVEL))
        live = r["ref_norm"] > 0 and r["dir_norm"] > 0  # a zero row (consensus.is_zero) has cosine 0: chance
        chance = not live or abs(r["cosine"]) < band
        mark = ("missing" if r.get("missing") else "zero" if r.get("zero") else "chance" if chance
                else ("agree" if r["agree"] else "disagree"))
        r.update(null_std=std, z=r["cosine"] / std, null_band=band, chance=chance, mark=mark)
    return rows


def _vectors(ws, exprs: list[str], allow_missing: bool, modules_to_save: str = "refuse",
             allow_base_mismatch: bool = False):
    """Open the adapters (``workspace.inputs.open_inputs``), evaluate and align the expressions; missing modules
    become zeros and are listed per adapter name.

    Returns:
        (task vectors with every module, module names, {adapter: [modules it lacks]},
        [per expression: the set of modules every adapter of it has], the opened Inputs).
    """
    forms = [parse(e) for e in exprs]
    inputs = open_inputs(ws, [n for f in forms for n in f.names()], modules_to_save=modules_to_save,
                         allow_base_mismatch=allow_base_mismatch)
    vecs, names = inputs.align(list(zip(exprs, forms)), allow_missing)
    for e, v in zip(exprs, vecs):
        for m, x in v.modules.items():
            check_magnitude(m, f"{e!r}", x, "keep the expression's coefficients and the adapters' lora_alpha in a "
                            "sane range")
    shapes = {m: next(v[m].shape for v in vecs if m in v.modules) for m in names}
    missing = inputs.missing(names)
    full = [TaskVector({m: v.modules.get(m) or LowRank.zeros(shapes[m]) for m in names}, v.specs) for v in vecs]
    present = [set(names).difference(*(missing[n] for n in f.names())) for f in forms]
    return full, names, {n: ms for n, ms in missing.items() if ms}, present, inputs


def pairwise(vectors: list[TaskVector], labels: list[str], names: list[str], progress=None,
             present: list | None = None) -> dict:
    """Global cosines and per-module agreement counts between every pair of task vectors.

    ``cosine[a][b] = sum_m <a_m, b_m> / (||a|| ||b||)`` (missing modules as zero);
    ``agree[a][b] = #{m compared: <a_m, b_m> > 0}``; ``significant[a][b]`` also needs
    ``|cos_m| >= 1.96 / sqrt(out in)`` (analytic band). A module is *compared* for a pair when every
    input of both sides has it (``compared[a][b]`` counts them; a missing module is not a disagreement).

    Args:
        vectors (list[TaskVector]): aligned, every module present. labels (list[str]): their names.
        present (list[set] | None): per vector, the modules its inputs all have (default: every module).
    """
    present = present or [set(names)] * len(vectors)
    k = len(vectors)
    norms = [[0.0] * len(names) for _ in vectors]
    inner = {(a, b): [0.0] * len(names) for a in range(k) for b in range(a, k)}
    for j, m in enumerate(progress(names) if progress else names):
        for a in range(k):
            norms[a][j] = float(torch.linalg.vector_norm(vectors[a][m].singular_values()))
            for b in range(a, k):
                inner[a, b][j] = norms[a][j] ** 2 if a == b else vectors[a][m].inner(vectors[b][m])
    std = [1.0 / math.sqrt(vectors[0][m].shape[0] * vectors[0][m].shape[1]) for m in names]
    total = [math.sqrt(sum(x * x for x in n)) for n in norms]
    cos_m = {}
    cosine = [[0.0] * k for _ in range(k)]
    agree = [[0] * k for _ in range(k)]
    sig = [[0] * k for _ in range(k)]
    compared = [[0] * k for _ in range(k)]
    for (a, b), ips in inner.items():
        cs = [ip / (norms[a][j] * norms[b][j]) if norms[a][j] * norms[b][j] > 0 else 0.0 for j, ip in enumerate(ips)]
        both = [m in present[a] and m in present[b] for m in names]
        cos_m[a, b] = [c for c, ok in zip(cs, both) if ok]
        g = sum(ips) / (total[a] * total[b]) if total[a] * total[b] > 0 else 0.0
        n_agree = sum(ip > 0 for ip, ok in zip(ips, both) if ok)
        n_sig = sum(ip > 0 and abs(c) >= Z_CRIT * s for ip, c, s, ok in zip(ips, cs, std, both) if ok)
        cosine[a][b] = cosine[b][a] = g
        agree[a][b] = agree[b][a] = n_agree
        sig[a][b] = sig[b][a] = n_sig
        compared[a][b] = compared[b][a] = sum(both)
    pairs = [{"a": labels[a], "b": labels[b], "cosine": cosine[a][b], "agree": agree[a][b],
              "significant": sig[a][b], "modules": len(names), "compared": compared[a][b],
              "cosine_median": statistics.median(cos_m[a, b]) if cos_m[a, b] else 0.0}
             for a in range(k) for b in range(a + 1, k)]
    return {"labels": list(labels), "modules": len(names), "norm": total, "cosine": cosine, "agree": agree,
            "significant": sig, "compared": compared, "pairs": pairs}


def audit_trajectories(ws, ref: str, direction: str, allow_missing: bool = False, samples: int = 200,
                       progress=None, *, modules_to_save: str = "refuse", allow_base_mismatch: bool = False
                       ) -> AuditReport:
    """``vecmerge audit --ref R --dir D``: per-module agreement of two expressions, against chance.

    Args:
        ws (Workspace): resolves names. ref, direction (str): expressions, e.g. ``v54 - v54e2``, ``v51 - v28``.
        allow_missing (bool): missing modules read as zero (and are not compared, see ``summarize``).
        samples (int): draws for the chance band (0: analytic). progress: optional callable wrapping the modules.
        modules_to_save (str): refuse | drop adapters' full saved modules.
        allow_base_mismatch (bool): audit adapters whose declared base models differ.
    Returns:
        AuditReport (reads as the JSON of the module docstring).
    """
    if samples < 0:
        raise VecmergeError(f"samples={samples}: give 0 (analytic band) or a positive number of draws")
    (rv, dv), names, missing, _, inputs = _vectors(ws, [ref, direction], allow_missing, modules_to_save,
                                                   allow_base_mismatch)
    rows, spectra = measure(rv, dv, names, progress)
    lacking = {n: set(ms) for n, ms in missing.items()}
    for r in rows:
        r["missing"] = [n for n, ms in lacking.items() if r["module"] in ms]
    check_not_zero(rows, ref, direction)
    mark_chance(rows, spectra, samples)
    summary = summarize(rows)
    summary.update(null_method="sampled" if samples else "analytic", samples=samples, level=LEVEL)
    experts = [r for r in rows if "expert" in r]
    if experts:
        marks = [r["mark"] for r in experts]
        summary["experts"] = {"rows": len(experts), "parameters": len({r["module"].rsplit(".", 1)[0] for r in experts}),
                              "agree": sum(bool(r["agree"]) for r in experts), "chance": marks.count("chance"),
                              "agree_significant": marks.count("agree"),
                              "disagree_significant": marks.count("disagree")}
    return AuditReport(ref, direction, missing, summary, rows, inputs.declared, inputs.base_models_differ)


def audit_pairwise(ws, adapters: list[str], allow_missing: bool = False, progress=None, *,
                   modules_to_save: str = "refuse", allow_base_mismatch: bool = False) -> PairwiseReport:
    """``vecmerge audit A B C...``: global cosines and per-module agreement between every pair.

    Args:
        ws (Workspace): resolves names. adapters (list[str]): two or more expressions.
        allow_missing (bool): missing modules read as zero (not compared). progress: optional iterable wrapper.
        modules_to_save (str), allow_base_mismatch (bool): as for ``audit_trajectories``.
    """
    vecs, names, missing, present, inputs = _vectors(ws, list(adapters), allow_missing, modules_to_save,
                                                     allow_base_mismatch)
    res = pairwise(vecs, list(adapters), names, progress, present)
    return PairwiseReport(missing, {k: v for k, v in res.items() if k != "pairs"}, res["pairs"], inputs.declared,
                          inputs.base_models_differ)
