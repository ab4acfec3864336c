"""``run(recipe)``: every output of a recipe, built, checked for warnings, and written (unless a dry run).

For every output (one, or one per dose multiple k)::

    intended_m = base_m + k * alpha_m * dir'_m          (or the method's update, without a step)
    written_m  = cut(intended_m, rank policy), rounded to the output dtype

The report (``RunReport``) says how much of the step survived:
``survival = sum_m <written_m - base_m, step_m> / ||step||^2`` and
``residual = ||written - intended|| / ||step||`` (global Frobenius norms, factored).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from .. import methods
from ..analysis.step import StepSize
from ..errors import CheckFailed, Problem, RecipeError, few, shown
from ..linalg.threads import Progress
from ..options import is_hub_id
from ..outputs.card import model_card
from ..outputs.manifest import MANIFEST_NAME
from ..outputs.transaction import OutputTransaction
from ..peft.format import SAFETENSORS_NAME
from ..peft.write import OUTPUT_FILES, weights_stream, write_adapter
from ..recipe.recipe import Recipe
from ..version import __version__
from ..workspace.base_model import canonical, differ, mismatch_text
from ..workspace.names import Workspace
from .bias import check as check_biases
from .bias import check_base as check_base_biases
from .bias import has_biases
from .build import BuiltOutput, build_output
from .evaluation import Evaluation, evaluate, operand_forms
from .gate_check import GateCheck, GateFailed, check_gate
from .inputs import output_plan, output_policy
from .manifest import card_body, manifest_for
from .protection import base_model_of, capture, energies, energy_out, protect
from .self_check import ModuleCheck, self_check

SURVIVAL_WARN = 0.99  # warn (and fail with --strict) when less of the step survives
RESIDUAL_WARN = 0.10  # ... or when the written update misses the intended one by more than this x ||step||
DTYPE_WARN = 0.01  # ... or when dtype rounding alone moves the update by more than this share of its norm
STEP_WARN = 0.5  # warn when the step is more than half the backbone's norm (a trust region is a few percent)


@dataclass
class OutputReport:
    """One output: where it goes, its dose and alpha, its figures and warnings, and (once written) its hash.

    Args:
        multiple (float): the dose. path (str | None): its folder (None in a dry run without --out).
        figures (dict): ``figures.figures``. warnings (list[str]). alpha (float | None): global alpha x dose.
        realized (dict | None): the relative step. sha256 (str | None), manifest (str | None): once written.
        protection (dict | None): a protected step's figures at this output's energy.
    """

    multiple: float
    path: str | None
    figures: dict
    warnings: list
    alpha: float | None = None
    realized: dict | None = None
    sha256: str | None = None
    manifest: str | None = None
    protection: dict | None = None

    def to_dict(self) -> dict:
        d = {"multiple": self.multiple, "path": self.path, "figures": self.figures, "warnings": self.warnings,
             "alpha": self.alpha}
        if self.protection is not None:
            d["protection"] = self.protection
        if self.realized is not None:
            d["realized"] = self.realized
        if self.sha256 is not None:
            d.update(sha256=self.sha256, manifest=self.manifest)
        return d


@dataclass
class RunReport:
    """What ``run`` did: the evaluation it rests on and one ``OutputReport`` per output.

    Args:
        evaluation (Evaluation): inputs, consensus, step. dry_run (bool): nothing was written.
        outputs (list[OutputReport]). notes (list[str]): things to know before uploading (not warnings).
        gate (GateCheck | None): the gate it passed (recipes with ``gate``).
        recovered (list[str]): leftovers of an interrupted earlier run that were cleaned up or restored
            before writing (``safe_recover``), one line each.
    """

    evaluation: Evaluation
    dry_run: bool
    outputs: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    gate: GateCheck | None = None
    recovered: list = field(default_factory=list)

    @property
    def recipe(self) -> Recipe:
        return self.evaluation.recipe

    @property
    def command(self) -> str:
        return self.recipe.kind

    @property
    def step(self) -> StepSize | None:
        """The chosen step (``step.StepSize``: alpha, trust, clipped, norms), None without one."""
        return self.evaluation.step

    def step_dict(self) -> dict | None:
        """The step's figures: alpha (full precision), trust, clipping, norms, method, dropped, realized step."""
        ev = self.evaluation
        st = ev.step
        if st is None:
            return None
        return {"alpha": st.alpha, "trust": st.trust, "scope": st.scope, "requested_alpha": st.requested_alpha,
                "clipped": st.clipped, "base_norm": st.base_norm, "dir_norm": st.dir_norm, "mode": ev.method.name,
                "dropped": list(ev.dropped), "zeroed": list(ev.zeroed), "realized": st.realized(),
                "dropped_by_consensus": list(ev.dropped), "zeroed_by_method": list(ev.zeroed),
                "zeroed_reason": ev.method.zero_reason if ev.zeroed else None}

    def to_dict(self) -> dict:
        """The JSON report (``--json``); keys are only ever added."""
        ev = self.evaluation
        d = {"command": self.command, "vecmerge_version": __version__, "recipe": self.recipe.to_dict(),
             "inputs": {n: i.to_dict() for n, i in ev.inputs.items()}, "modules": len(ev.names),
             "missing_modules": ev.missing, "dry_run": self.dry_run, "outputs": [o.to_dict() for o in self.outputs],
             "notes": self.notes}
        if ev.consensus is not None:
            d["consensus"] = ev.consensus.to_dict()
        if ev.step is not None:
            d["step"] = self.step_dict()
        if self.gate is not None:
            d["gate"] = self.gate.to_dict()
        if ev.selection() is not None:
            d["selection"] = ev.selection()
        if ev.multipliers:
            d["multipliers"] = dict(ev.multipliers)
        extra = {k: v for k, v in (ev.params or {}).items() if k not in self.recipe.params}
        if extra:
            d["method_params"] = extra
        if self.recovered:
            d["recovered"] = list(self.recovered)
        return d


def warnings_for(ev: Evaluation, built: BuiltOutput, roots: Iterable[Path] = ()) -> list[str]:
    """Plain-words warnings about one output: little of the step survived, dtype rounding, idle modules,
    a step far outside a trust region, an all-zero update, inputs of different base models (``roots``:
    where their relative declared paths start, see ``workspace.base_model.canonical``)."""
    recipe, fig, st = ev.recipe, built.figures, ev.step
    out = []
    if "survival" in fig and fig["survival"] < SURVIVAL_WARN and st is None:
        fix = "a larger --rank, energy:E" + (", or --space core" if ev.method.space_for(recipe.params) == "dense"
                                               else ", or --rank exact")
        out.append(f"only {fig['survival']:.2%} of the intended {ev.method.name} merge survives (rank {recipe.rank}, "
                   f"dtype {recipe.dtype}; relative error {fig['rel_error']:.3g}); use {fix}")
    elif "survival" in fig and fig["survival"] < SURVIVAL_WARN:
        policy = recipe.rank_policy
        measure = (f" (energy:E measures the whole update; --rank step-energy:{policy.value:g} measures the step)"
                   if policy.kind == "energy" else "")
        out.append(f"only {fig['survival']:.2%} of the step survives (rank {recipe.rank}, "
                   f"dtype {recipe.dtype}); use --rank exact or a wider dtype{measure}")
    if st is not None and st.scope == "module":
        idle = [m for m in ev.names if st.base_module_norms[m] == 0 and st.dir_module_norms[m] > 0]
        if idle:
            out.append(f"{len(idle)} module(s) have a zero backbone, so trust_scope=module gives them "
                       f"no step: {few(idle)}; use trust_scope=global or --alpha")
    fix = " or ".join(([] if recipe.rank_policy.lossless else ["--rank exact"])
                      + ([] if recipe.dtype == "fp32" else ["--dtype fp32"])) or "a larger step"
    if fig.get("residual", 0.0) > RESIDUAL_WARN:
        out.append(f"the written update is off the intended one by {fig['residual']:.1%} of the step "
                   f"(rank {recipe.rank}, dtype {recipe.dtype}); use {fix}")
    if fig["dtype_effect"] > DTYPE_WARN:
        fix = ("the update's magnitude is extreme for fp32 factors" if recipe.dtype == "fp32"
               else "use --dtype fp32")
        out.append(f"rounding to {recipe.dtype} moved the update by {fig['dtype_effect']:.1%} of its norm "
                   f"(entries under- or overflow); {fix}")
    if st is not None and st.realized(built.multiple)["global"] > STEP_WARN:
        out.append(f"the step is {st.realized(built.multiple)['global']:.0%} of the backbone's norm: far outside "
                   "a trust region (the user's v58 stepped 1.13%); --trust is a share, e.g. 0.0113 for 1.13%")
    if fig.get("norm") == 0.0:
        out.append("the written update is zero in every module (the expression cancels), so the adapter "
                   "changes nothing")
    out += ev.method.warnings(recipe.params)
    out += (ev.protection or {}).get("warnings", [])
    declared = {n: i.base_model for n, i in ev.inputs.items()}
    if differ(declared, roots):
        out.append(f"{mismatch_text(declared, roots)}; combined anyway (allow_base_mismatch)")
    return out


def protected_recipes(recipe: Recipe) -> list[Recipe]:
    """One recipe per protection energy (``OUT-e<E>`` when there are several); the recipe itself otherwise."""
    if not recipe.protect:
        return [recipe]
    es = energies(recipe)
    if len(es) == 1:
        return [dataclasses.replace(recipe, protect_energy=es)]
    return [dataclasses.replace(recipe, protect_energy=[e], out=energy_out(recipe.out, e)) for e in es]


def _base_model_for(recipe: Recipe, ev: Evaluation) -> tuple[str | None, list[str]]:
    """The base model the output declares (hub id when known) and a note when it is a local path."""
    if recipe.base_model_id:
        return recipe.base_model_id, []
    name = ev.template.config.base_model
    key = canonical(name)
    if key is None:
        return None, ["the output names no base model (its template config has none); pass --base-model-id "
                      "ORG/NAME (or base_model_id: in vecmerge.yaml) before uploading"]
    if is_hub_id(name) and not Path(key).is_dir():
        return name, []
    return name, [f"adapter_config.json names the base model by the local path {shown(name)}; pass --base-model-id "
                  "ORG/NAME (or base_model_id: in vecmerge.yaml) to write its hub id before uploading"]


def _build(ev: Evaluation, ws: Workspace, multiple: float, path: str | None, progress: Progress | None,
           folder: Path | None = None) -> tuple[BuiltOutput, OutputReport, str | None]:
    """One output built and checked: ``(BuiltOutput, OutputReport, weights sha256 | None)``.

    With ``folder`` (a staged output folder) the weights are streamed into it as the modules are made
    (``peft.write.weights_stream``; not for ``target_parameters`` adapters, whose tensors come back in
    ``BuiltOutput.tensors``). Raises CheckFailed for a lossless output that verify would refuse, or any
    warning under ``--strict``.
    """
    recipe = ev.recipe
    check = ModuleCheck(ev)
    stream = None
    if folder is not None and not any(s.param for s in ev.specs.values()):
        extra = None
        if recipe.rank_policy.kind == "keep-base":  # the backbone's own factors come first, then the step's
            backbone = ev.vectors[ev.base_name].modules
            extra = {m: backbone[m].rank for m in ev.names if m in backbone}
        stream = weights_stream(folder / SAFETENSORS_NAME, ev.specs, recipe.dtype, ev.names, extra, has_biases(ev))
    try:
        b = build_output(ev, multiple, progress, sink=None if stream is None else stream.put, check=check)
        self_check(ev, b, check.failed)
        st = ev.step
        entry = OutputReport(multiple, path, b.figures, warnings_for(ev, b, (ws.home,)),
                             None if st is None or st.alpha is None else st.alpha * multiple,
                             None if st is None else st.realized(multiple), protection=ev.protection)
        if recipe.strict and entry.warnings:
            raise CheckFailed(f"--strict: {entry.warnings[0]}; nothing written")
        sha = None if stream is None else stream.close()
    except BaseException:
        if stream is not None:
            stream.abort()
        raise
    return b, entry, sha


def run(recipe: Recipe, ws: Workspace | None = None, *, dry_run: bool = False, force: bool = False,
        progress: Progress | None = None, source: dict | None = None) -> RunReport:
    """Evaluate, gate, step, re-factor and (unless ``dry_run``) write every output.

    Args:
        recipe (Recipe): what to do. ws (Workspace | None): name resolution (default: cwd).
        dry_run (bool): compute the full report, write nothing. force (bool): replace outputs.
        progress: optional callable wrapping iterables (tqdm) for long loops.
        source (dict | None): the file the recipe was translated from (``merge --config``: its format, path
            and sha256), kept in each manifest as ``config``.

    Returns:
        RunReport; raises CheckFailed (exit 1) for a failed consensus gate or ``--strict``, and GateFailed
        (exit 1, with the table) when the recipe asks for the seven-condition gate and it does not pass.
    """
    ws = ws or Workspace()
    if recipe.base_model_id is None and ws.base_model_id is not None:
        recipe = dataclasses.replace(recipe, base_model_id=ws.base_model_id)  # recorded in the manifest
    variants = protected_recipes(recipe)
    if recipe.protect:
        base_model_of(recipe, ws)  # no base model: refused before any work
    plan = [p for r in variants for p in output_plan(r)]
    policy = None
    if not dry_run:  # refuse a bad --out before any work: the commit checks every target again
        if any(p is None for _, p in plan):
            raise RecipeError([Problem("{out}: missing (where to write the adapter), or use --dry-run")])
        names = list(dict.fromkeys(n for form in operand_forms(recipe, methods.get(recipe.method)).values()
                                   for n in form.names()))
        policy = output_policy(recipe, ws, names, force)
        for _, p in plan:
            policy.check_folder(p, expected_entries=OUTPUT_FILES)
    gate = None
    if recipe.gate:  # the seven conditions first: nothing is written unless every one passes
        gate = check_gate(recipe, ws, progress)
        if not gate.passed:
            raise GateFailed(gate)
        if gate.error is not None:
            raise gate.error
    if gate is not None and gate.evaluation is not None:
        # the gate evaluated with its own base check relaxed (its "common base" row states it); the output
        # records the recipe as typed, so a re-run gates and checks the base again
        ev = dataclasses.replace(gate.evaluation, recipe=recipe)
    else:
        ev = evaluate(recipe, ws, progress)
    check_biases(ev)  # lora_bias inputs: their biases merge exactly by a linear recipe, else refused
    check_base_biases(ev, [recipe.base_model, ws.base_model, *(i.base_model for i in ev.inputs.values())],
                      (ws.home,))  # ... and only onto a base model whose layers have a bias to merge them into
    report = RunReport(ev, dry_run, gate=gate)
    base_model, notes = _base_model_for(recipe, ev)
    if has_biases(ev):
        notes.append("lora_bias: the inputs' bias updates (scale * lora_B.bias) are combined exactly by the recipe's "
                     "coefficients (a missing bias is zero) and written as lora_B.bias with lora_bias: true")
    if recipe.protect:  # the protected inputs once, then D' per energy (each with its own alpha)
        cap = capture(ev, ws, progress)
        evs = [protect(dataclasses.replace(ev, recipe=r), cap, energies(r)[0]) for r in variants]
        report.evaluation = evs[0]
    else:
        evs = [ev]
    if policy is None:  # --dry-run: nothing is written
        for one in evs:
            for multiple, path in output_plan(one.recipe):
                report.outputs.append(_build(one, ws, multiple, path, progress)[1])
        report.notes = notes
        return report
    same = set(ev.names) == set(ev.vectors[ev.base_name].modules)
    template = ev.template.config
    if base_model != template.base_model:
        template = dataclasses.replace(template, base_model=base_model,
                                       raw={**template.raw, "base_model_name_or_path": base_model})
    # Every output of the run, or none (a dose ladder too): each is streamed into its staged folder as it
    # is built (one module's tensors in memory at a time), and a failed check leaves nothing behind.
    with OutputTransaction(policy) as txn:
        for ev, (multiple, path) in ((e, p) for e in evs for p in output_plan(e.recipe)):
            if path is None:  # refused before any work ({out}: missing)
                raise ValueError("an output without a folder to write")
            folder = txn.folder(path, expected_entries=OUTPUT_FILES)
            b, entry, sha = _build(ev, ws, multiple, path, progress, folder)
            manifest = manifest_for(ev, b, entry.path, ws.home, gate=None if gate is None else gate.to_dict(),
                                    source=source)
            title = recipe.name or Path(path).name
            card = model_card(base_model if not notes else None, title, card_body(manifest))
            res = write_adapter(folder, b.written, ev.specs, weights_sha256=sha, tensors=b.tensors if sha is None
                                else None, template=template, manifest=manifest, card=card, dtype=recipe.dtype,
                                same_modules=same, lora_bias=has_biases(ev))
            entry.sha256 = res["sha256"]
            entry.manifest = str(Path(path) / MANIFEST_NAME)
            report.outputs.append(entry)
        txn.commit()
    report.notes = notes
    report.recovered = list(txn.recovered)
    return report
