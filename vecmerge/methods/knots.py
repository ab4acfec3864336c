"""``knots``: KnOTS (Stoica et al., ICLR 2025, "Model merging with SVD to tie the KnOTS"), exact in factored form.

The paper (Sec. 4): the updates side by side, ``[D_1 .. D_n] = U S [V_1^T .. V_n^T]`` (its non-zero part), align
the models in one basis ``U``; each model is then ``U (S V_i^T)`` and a merge method runs on the
representations ``R_i = S V_i^T`` (k, in), element by element: ``knots_merge: ties`` (TIES, the paper's
KnOTS-TIES, with PEFT's rule as ``ties``: the density per model and module, where the paper trims over the
whole model), ``dare_ties`` (KnOTS-DARE-TIES) or ``linear``; the merge is ``U R_merged``.

On a module's cores: ``[D_1 .. D_n] = Qb [C_1 .. C_n] (I (x) Qa^T)``, so ``U = Qb u`` and ``R_i = diag(s) v_i^T Qa^T``
from the SVD of the small ``[C_1 .. C_n]`` (p, n q): only the (k, in) representations are formed, never an
(out, in) matrix, and the merge is written as the factors ``(Qb u, R_merged)`` of rank at most k. The linear
variant is task arithmetic itself (``U U^T D_i = D_i``), which the tests check.
"""

from __future__ import annotations

from .base import Field, Method
from .elementwise import DENSITY, SEED, generator, module_densities
from .registry import register

MERGES = ("ties", "dare_ties", "linear")
KNOTS_MERGE = Field("knots_merge", "KnOTS: the merge of the aligned representations: ties (KnOTS-TIES), "
                    "dare_ties or linear", kind="str", default="ties", choices=MERGES)


@register
class Knots(Method):
    """``U merge(S V_1^T .. S V_n^T)`` in the models' joint singular basis (see the module docstring)."""

    name = "knots"
    summary = ("KnOTS: align the models in the joint SVD of their updates, merge the aligned representations "
               "by --knots-merge (ties, dare_ties, linear; --density), written as factors (exact)")
    operands = ("models",)
    fields = (KNOTS_MERGE, DENSITY, SEED)

    def validate(self, recipe):
        how = recipe.params.get("knots_merge", "ties")
        lacking = [str(e.get("model")) for e in recipe.models or [] if e.get("density") is None]
        if how != "linear" and recipe.params.get("density") is None and lacking and "density" not in recipe.given:
            return [f"method=knots with knots_merge {how}: needs density (e.g. --density 0.5), or a density for "
                    f"each model (missing for {', '.join(lacking)})"]
        return []

    def module(self, x, params):
        import torch

        from ..linalg.lowrank import LowRank
        from ..linalg.merge_kernels import dare_ties, ties
        from ..linalg.spectral import nonzero_svd

        space = x.models[0].space
        n, q = len(x.models), space.q
        u, s, vh = nonzero_svd(torch.cat([m.C for m in x.models], 1))
        if s.numel() == 0:
            return LowRank.zeros(x.models[0].shape, space.device)
        R = torch.stack([space.right(s[:, None] * vh[:, i * q:(i + 1) * q]) for i in range(n)])  # (n, k, in)
        how = params.get("knots_merge", "ties")
        if how == "linear":
            merged = (R * torch.tensor(x.weights, dtype=R.dtype, device=R.device).view(-1, 1, 1)).sum(0)
        elif how == "ties":
            merged = ties(R, x.weights, module_densities(x, params))
        else:
            merged = dare_ties(R, x.weights, module_densities(x, params), generator(params["seed"], x.name),
                               mask_dtype=torch.float32)
        return LowRank(space.left(u), merged, 1.0)
