"""One stored rank per MoE parameter: the common-rank rule for the experts of a 3-D parameter.

PEFT stores a parameter's E experts in one lora_A (E*r, in) and one lora_B (out, r*E): one rank for all. The
rank policy chooses each expert's own k_e; the parameter is written at

    k_p = max_e k_e

with expert e cut at ``min(k_p, exact_e)`` directions and zero-padded up to k_p, so no expert keeps less than
the policy gives it alone. ``figures`` reports both the per-expert and the written cut (counts, survival,
errors). Why not one k over the joint spectrum: docs/design/pipeline.md.
"""

from __future__ import annotations

from collections.abc import Iterable


def groups(specs: dict, names: Iterable[str]) -> dict[str, list[str]]:
    """``{parameter target: [expert modules]}`` of the expert modules among ``names``, in order."""
    out: dict[str, list[str]] = {}
    for m in names:
        if specs[m].kind == "expert":
            out.setdefault(specs[m].target, []).append(m)
    return out


def common_ranks(rows: dict, specs: dict) -> dict[str, int]:
    """``{expert: k_p}`` for every expert whose own cut is below its parameter's common rank k_p.

    Args:
        rows (dict[str, ModuleBuild]): each module cut at the policy's own choice.
        specs (dict[str, ModuleSpec]): layouts (which modules are experts of which parameter).
    """
    out: dict[str, int] = {}
    for members in groups(specs, rows).values():
        k = max(rows[m].cut.rank for m in members)
        out.update((m, k) for m in members if rows[m].cut.rank < k)
    return out


def expert_figures(own: dict, rows: dict, specs: dict, own_figures: dict | None) -> dict:
    """What the common rank costs: stored, own and zero directions per parameter, and the per-expert cut's figures.

    Args:
        own (dict[str, ModuleBuild]): the experts cut at their own rank (only those re-cut, or all).
        rows (dict[str, ModuleBuild]): every module as written.
        specs (dict[str, ModuleSpec]). own_figures (dict | None): ``figures`` of the per-expert cut
            (None when no expert needed a larger rank).

    Returns:
        ``{rule, parameters: {target: {experts, rank, own_rank: {min, max}, padded_experts, zero_directions}},
        stored_directions, own_directions, zero_directions[, own_cut: {rel_error[, survival, residual]}]}``.
    """
    params, stored, needed, zeros = {}, 0, 0, 0
    for target, members in groups(specs, rows).items():
        k = rows[members[0]].cut.rank
        own_k = [(own[m] if m in own else rows[m]).cut.rank for m in members]
        # a randomized cut of a dense update has no exact rank: it keeps its own k_e directions, padded to k
        kept = [o if rows[m].cut.exact_rank is None else rows[m].cut.exact_rank for m, o in zip(members, own_k)]
        zero = [k - min(k, x) for x in kept]
        params[target] = {"experts": len(members), "rank": k, "own_rank": {"min": min(own_k), "max": max(own_k)},
                          "padded_experts": sum(z > 0 for z in zero), "zero_directions": sum(zero)}
        stored, needed, zeros = stored + k * len(members), needed + sum(own_k), zeros + sum(zero)
    out = {"rule": "one rank per parameter: the largest of its experts' own ranks, zero-padded below it",
           "parameters": params, "stored_directions": stored, "own_directions": needed, "zero_directions": zeros}
    if own_figures is not None:
        out["own_cut"] = {k: own_figures[k] for k in ("rel_error", "survival", "residual") if k in own_figures}
    return out
