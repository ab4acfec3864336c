"""A protected step in the pipeline: the protected inputs captured at the backbone, the direction projected, alpha
chosen again on ``D'`` (definition: ``analysis/protect.py``, DESIGN.md section 8).

    capture      probe's prompt reader and model loader; the backbone's update on as hooks; ``G_k`` per set and
                 module (``probe/capture.py``), once for every energy
    protect      per stepped module ``U_m`` by energy E, ``D'_m`` in its widened basis, the backbone's core widened
                 alike; ``choose_step`` on ``D'`` (so ``--trust`` bounds the projected step)
    figures      ``kept_drift_k = ||D' X_k^T|| / ||D X_k^T||`` over all modules, ``kept_direction = ||D'|| / ||D||``,
                 per target ``kept_change``, the rank of each ``U_m``, the prompt files' sha256, the base model
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

import torch

from ..analysis.protect import ENERGY_DEFAULT, project, quadratic, quadratic_rows, ratio, widen
from ..analysis.step import choose_step
from ..errors import ModelError, NumericError, Problem, RecipeError
from ..linalg.subspace import InSpan
from ..linalg.threads import Progress
from ..probe.capture import Grams, capture_grams
from ..probe.hooks import Update
from ..probe.inputs import Inputs
from ..probe.prompts import read_prompts
from ..probe.runner import load_base
from ..recipe.recipe import Recipe
from ..workspace.names import Workspace
from ..workspace.taskvector import TaskVector
from .evaluation import Evaluation


class BaseIdentity(TypedDict):
    """The base model a protected step ran its prompts on, as the report and manifest record it."""

    path: str
    config_sha256: str | None
    model_type: str | None
    parameters: int


@dataclass
class Captured:
    """What every energy of one run shares: the base model folder and identity, the sets read, their Grams."""

    base_model: Path
    identity: BaseIdentity
    sets: dict  # name -> PromptSet (protected, then targets)
    grams: Grams


def base_model_of(recipe: Recipe, ws: Workspace) -> Path:
    """The base model folder a protected step reads: the recipe's ``base_model``, else the workspace's."""
    folder = recipe.base_model or ws.base_model
    if folder is None:
        raise RecipeError([Problem("{protect}: needs the base model the protected prompts run on; pass {base_model} "
                                   "FOLDER (or write base_model: in vecmerge.yaml)")])
    return Path(folder)


def identity(folder: Path, model: torch.nn.Module) -> BaseIdentity:
    """The base model as recorded: its folder, its config.json's sha256, its type and parameter count."""
    cfg = folder / "config.json"
    sha = hashlib.sha256(cfg.read_bytes()).hexdigest() if cfg.is_file() else None
    return {"path": str(folder.resolve()), "config_sha256": sha,
            "model_type": getattr(model.config, "model_type", None),
            "parameters": int(sum(p.numel() for p in model.parameters()))}


def _backbone_updates(ev: Evaluation, model: torch.nn.Module, modules: list) -> dict:
    """The backbone's update per module as hooks (float32 factors ``(Qb C, Qa^T)``), checked against the model."""
    out, bad = {}, []
    for m in ev.names:
        try:
            weight = model.get_submodule(m).weight
        except AttributeError:
            weight = None
        if not isinstance(weight, torch.Tensor):
            bad.append(f"{m}: no such module")
            continue
        if m in modules and tuple(weight.shape) != tuple(ev.specs[m].weight_shape):
            bad.append(f"{m}: weight {tuple(weight.shape)}, the adapter's update {tuple(ev.specs[m].weight_shape)}")
            continue
        x = ev.operands["base"][m]
        if x.norm() == 0.0:
            continue
        if ev.specs[m].kind != "linear":
            bad.append(f"{m}: the backbone adapts this {ev.specs[m].kind} module, and protection captures inputs with "
                       "linear updates only (not supported yet)")
            continue
        lr = x.lowrank()
        out[m] = Update("linear", lr.A.float().to(weight.device), (lr.B * lr.scale).float().to(weight.device), 1.0)
    if bad:
        raise ModelError(f"--protect: {len(bad)} module(s) cannot be captured on --base-model ({'; '.join(bad[:3])}); "
                         "use the base model the adapters were trained on, and adapters of linear modules")
    return out


def protected_modules(ev: Evaluation) -> list[str]:
    """The modules whose direction is projected: stepped, linear, with a non-zero direction."""
    left_out, direction = set(ev.unselected), _direction(ev)
    return [m for m in ev.names if m not in left_out and ev.specs[m].kind == "linear" and direction[m].norm() > 0]


def _direction(ev: Evaluation) -> TaskVector:
    """The direction of a completed stepped evaluation (ValueError for any other: a caller's error)."""
    if ev.direction is None:
        raise ValueError("protection projects a step's direction: complete a stepped recipe first")
    return ev.direction


def capture(ev: Evaluation, ws: Workspace, progress: Progress | None = None) -> Captured:
    """Read the prompt sets, load the base model, and capture every set's Grams with the backbone on."""
    recipe = ev.recipe
    folder = base_model_of(recipe, ws)
    sets = {}
    for name, path in {**(recipe.protect or {}), **(recipe.target or {})}.items():
        sets[name] = read_prompts(path, folder, stem=name)
    model = load_base(folder, torch.device("cpu"))
    vocab = model.get_input_embeddings().num_embeddings
    context = getattr(model.config, "max_position_embeddings", None)
    for ps in sets.values():
        ps.check_vocab(vocab, f"--base-model {folder}")
        longest = max(ps.items, key=lambda it: it.length)
        if context is not None and longest.length > context:
            raise RecipeError([Problem("{protect}: " + f"{ps.path}: line {longest.line} ({longest.id}) holds "
                                       f"{longest.length} tokens, more than the model's context of {context}; "
                                       "shorten it")])
    modules = protected_modules(ev)
    grams = capture_grams(model, _backbone_updates(ev, model, modules), sets, modules, progress=progress)
    return Captured(folder, identity(folder, model), sets, grams)


def protect(ev: Evaluation, cap: Captured, energy: float) -> Evaluation:
    """``ev`` with its direction projected at energy E, its step chosen again, and ``protection`` (the figures).

    Args:
        ev (Evaluation): a completed stepped evaluation (direction after mode, consensus, multipliers).
        cap (Captured): ``capture``'s result. energy (float): E in (0, 1].
    """
    recipe = ev.recipe
    names_p = list(recipe.protect or {})
    names_t = list(recipe.target or {})
    modules = protected_modules(ev)
    operands = {k: dict(v.modules) for k, v in ev.operands.items()}
    old_dir = _direction(ev)
    direction = dict(old_dir.modules)
    ranks, widths = {}, {}
    drift = {k: [0.0, 0.0] for k in names_p + names_t}  # [||D' X^T||^2, ||D X^T||^2]
    d_sq = sum(x.norm() ** 2 for x in old_dir.modules.values())
    for m in modules:
        try:
            U = cap.grams.basis(names_p, m, energy)
        except NumericError:
            files = ", ".join(str(cap.sets[k].path) for k in names_p)
            raise RecipeError([Problem("{protect}: " + f"{m}: its inputs on the protected prompts ({files}) are all "
                                       "zero, so nothing can be protected there; --exclude it or use other prompts")]
                              ) from None
        d = old_dir.modules[m]  # the direction's core in the module's basis (InSpan)
        pr = project(d, U)
        direction[m] = pr.direction
        for v in operands.values():
            x = v[m]
            if isinstance(x, InSpan) and x.space is d.space:
                v[m] = widen(x, pr.space)
        wide = widen(d, pr.space)
        for k in names_p + names_t:
            drift[k][0] += _quadratic(pr.direction, cap.grams.by_set[k][m])
            drift[k][1] += _quadratic(wide, cap.grams.by_set[k][m])
        ranks[m], widths[m] = pr.rank, int(U.shape[0])
    specs = old_dir.specs
    new_dir = TaskVector(direction, specs)
    new_ops = {k: TaskVector(v, ev.operands[k].specs) for k, v in operands.items()}
    step = choose_step(new_ops["base"], new_dir, trust=recipe.trust, alpha=recipe.alpha, scope=recipe.trust_scope)
    kept_dir = ratio(sum(x.norm() ** 2 for x in direction.values()), d_sq)
    info = _figures(recipe, cap, energy, drift, kept_dir, ranks, widths)
    return dataclasses.replace(ev, operands=new_ops, direction=new_dir, step=step, protection=info)


def _quadratic(x: InSpan, inputs: Inputs) -> float:
    """``||x X^T||_F^2`` from the kept rows (or sketch) where there are, else from the Gram."""
    F = inputs.factor()
    return quadratic_rows(x, F) if F is not None else quadratic(x, inputs.gram())


def _figures(recipe: Recipe, cap: Captured, energy: float, drift: dict, kept_dir: float | None, ranks: dict,
             widths: dict) -> dict:
    """The ``protection`` section of the report and manifest, and its plain warnings."""
    def entry(k: str, figure: str) -> dict:
        ps = cap.sets[k]
        return {"path": str(ps.path), "sha256": ps.sha256, "items": len(ps.items), "positions": cap.grams.rows[k],
                figure: ratio(*drift[k])}

    protected = {k: entry(k, "kept_drift") for k in recipe.protect or {}}
    targets = {k: entry(k, "kept_change") for k in recipe.target or {}}
    warnings = []
    worst = max((v["kept_drift"] for v in protected.values() if v["kept_drift"] is not None), default=None)
    for k, v in targets.items():
        if worst is not None and v["kept_change"] is not None and v["kept_change"] <= worst:
            warnings.append(f"target {k} keeps {v['kept_change']:.3g} of its change, no more than a protected set "
                            f"keeps ({worst:.3g}): the protection removed what the target needed; try a lower "
                            "--protect-energy or protect prompts that differ from the target's")
    sketched = cap.grams.sketched()
    if sketched:
        worst_bound = max(d["bound"] for v in sketched.values() for d in v.values())
        g = cap.grams
        warnings.append(f"{len(sketched)} module(s) read inputs wider than {g.exact_width} on more than "
                        f"{2 * g.sketch_rows} positions: U and their figures come from a Frequent Directions sketch of "
                        f"{g.sketch_rows} rows, ||G - B^T B||_2 <= {worst_bound:.3g} tr(G) (inputs.sketched)")
    inputs = {"exact_width": cap.grams.exact_width, "sketch_rows": cap.grams.sketch_rows, "sketched": sketched}
    rank_values = list(ranks.values())
    return {"energy": energy, "base_model": cap.identity, "protect": protected, "target": targets,
            "kept_direction": kept_dir, "ranks": ranks, "input_widths": widths, "inputs": inputs,
            "rank_summary": {"modules": len(rank_values), "min": min(rank_values, default=0),
                             "max": max(rank_values, default=0),
                             "mean": (sum(rank_values) / len(rank_values)) if rank_values else 0.0},
            "warnings": warnings}


def energies(recipe: Recipe) -> list[float]:
    """The energies of a protected recipe (default ``ENERGY_DEFAULT``)."""
    return list(recipe.protect_energy or [ENERGY_DEFAULT])


def energy_out(out: str | None, energy: float) -> str | None:
    """``OUT-e<E>``: where the output of energy E goes when a recipe lists several."""
    return None if out is None else f"{out}-e{energy:g}"

