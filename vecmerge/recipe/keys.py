"""The recipe's keys, in one table: what each takes, what it means, and the flag that sets it.

Everything that describes a key reads this table: the options of ``vecmerge project``, ``merge``,
``refactor`` and ``run`` (``cli/recipe_flags.py``), the checks of the simple keys (``values.py``, by
``kind``), the key list of an unknown-key message, and the documentation (``docs.py``: ``vecmerge run
--help`` and docs/RECIPES.md). A key's ``help`` names other keys in braces (``{dir}``, see
``errors.Problem``): ``--dir`` in a command's ``--help``, ``dir`` in the recipe docs. A method's own
keys are its ``methods.Field`` s (the registry), not rows here. This module imports no torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .. import methods
from ..errors import in_words
from ..options import DTYPE_NAMES, MODULES_TO_SAVE, ON_DISAGREE, SCOPES

COMMANDS = ("project", "merge", "refactor", "run")  # the commands whose flags build a recipe


@dataclass(frozen=True)
class Key:
    """One recipe key.

    Args:
        name (str): the key; ``parent.child`` for a key inside a mapping (``consensus.ref``).
        kind (str): how its value is read (``values.READERS``): expression | number | choice | method |
            rank | dose | consensus | flag (true/false) | folder | model_folder (read, relative to the recipe) |
            text | hub_id | gate | inputs | models | pattern | multipliers | per_module. A key inside a
            mapping is read by its parent's reader (``consensus``).
        help (str): what it means, for ``--help`` and the docs; keys in braces, ``{}`` the methods' summaries
            (kind method).
        values (str): what it takes, for the docs (``takes``: the choices, or true | false, when it has them).
        choices (tuple[str]): the allowed values (kind choice). default: the value when absent (None: none).
        flag (str | None): the command-line flag that sets it (None: recipes only).
        commands (tuple[str]): the commands that offer ``flag`` (``run`` reads every key from the recipe; its
            flags override). required (bool): the flag must be given.
        alias_of (str | None): another key that names the same thing (``mode`` is ``method``).
        notes (tuple[tuple[str, str]]): ``(command, text)`` added to that command's ``--help``; the docs
            show every note (``recipe``: the docs only).
        above (float | None), hint (str): kind number: the value must exceed ``above``; ``hint`` says so.
    """

    name: str
    kind: str
    help: str
    values: str = ""
    choices: tuple = ()
    default: Any = None
    flag: str | None = None
    commands: tuple = ()
    required: bool = False
    alias_of: str | None = None
    notes: tuple = ()
    above: float | None = None
    hint: str = ""

    @property
    def param(self) -> str:
        """The Python name of its flag's value (``consensus.ref`` -> ``consensus_ref``)."""
        return self.name.replace(".", "_")

    def allowed(self) -> tuple[str, ...]:
        """The values it accepts by name: its choices, or the registered methods (kind method)."""
        if self.kind == "method":
            return methods.names(stepped=True) if self.name == "mode" else methods.merge_names()
        return tuple(self.choices)

    def takes(self) -> str:
        """What it takes, as the docs show it: its choices, true | false, or ``values``."""
        allowed = self.allowed()
        return " | ".join(allowed) if allowed else ("true | false" if self.kind == "flag" else self.values)

    def describe(self, command: str | None = None, flags: Mapping[str, str] | None = None) -> str:
        """Its help, with the notes for ``command`` (every note when None: the docs), keys spelled by ``flags``.

        Args:
            command (str | None): project | merge | refactor | run, or None for the recipe docs.
            flags (Mapping[str, str] | None): key -> flag (``words``); None: recipe words.
        """
        names = self.allowed()
        summaries = ("; ".join(f"{m}: {methods.get(m).summary}" for m in names),) if self.kind == "method" else ()
        text = in_words(self.help, summaries, flags)
        for where, note in self.notes:
            if command is None or where == command:
                text += in_words(note, (), flags)
        return text


_RANK_STEP = (" With a step ({dir}) also step-energy:E (smallest rank whose cut loses at most 1-E of the step's "
              "squared norm: use it when the step is small next to the backbone, which energy:E may cut away) and "
              "keep-base (the backbone's own factors bit for bit, the step's exact factors appended).")

KEYS: tuple[Key, ...] = (
    Key("base", "expression", "The backbone of a step (the adapter you step from, e.g. v54), or the whole update to "
        "re-factor (refactor): adapter names and numbers with + - * / ( ), e.g. 0.5*v16 + 0.5*v28. Names resolve "
        "through vecmerge.yaml (or {inputs}); a name that is not listed is a folder of that name.",
        values="expression", flag="--base", commands=("project",), required=True),
    Key("dir", "expression", "The direction to step along, e.g. 'v51 - v28'; with it the recipe is a step (written "
        "= base + alpha * dir').", values="expression", flag="--dir", commands=("project",), required=True),
    Key("trust", "number", "Relative step T: alpha = T*||base||/||dir'||, e.g. 0.0113 moves 1.13% of the "
        "backbone's norm. {trust} or {alpha} is needed with {dir}.", values="number > 0", flag="--trust",
        commands=("project",), above=0.0, hint="a relative step > 0, e.g. 0.0113"),
    Key("trust_scope", "choice", "global: one alpha from the norms over all modules, ||alpha*dir|| = T*||base||; "
        "module: an alpha per module, so that each module moves the share T of its own norm.", choices=SCOPES,
        default="global", flag="--trust-scope", commands=("project",)),
    Key("alpha", "number", "Alpha directly; with {trust}, trust bounds it (the report says when it clipped).",
        values="number", flag="--alpha", commands=("project",)),
    Key("consensus", "consensus", "The consensus gate: a mapping of ref, on_disagree and min_agree (each below); a "
        "plain expression is read as {{ref: ...}}.", values="{ref, on_disagree, min_agree}"),
    Key("consensus.ref", "expression", "Reference trajectory, e.g. 'v54 - v54e2': each module agrees when <ref_m, "
        "dir_m> > 0; see {consensus.on_disagree}.", values="expression", flag="--consensus-ref", commands=("project",)),
    Key("consensus.on_disagree", "choice", "What to do with modules whose <ref_m, dir_m> <= 0: fail (exit 1, write "
        "nothing), drop (zero them in the direction before alpha is chosen; reported as dropped by consensus), keep "
        "(step anyway).", choices=ON_DISAGREE, default="fail", flag="--on-disagree", commands=("project",)),
    Key("consensus.min_agree", "number", "Fail below this share (0..1) of modules agreeing in sign.",
        values="share in [0, 1]", flag="--min-agree", commands=("project",)),
    Key("method", "method", "A classic merge of {models} (vecmerge merge): {}.", flag="--method",
        commands=("merge",), notes=(("merge", " Needed unless --config gives a mergekit configuration."),)),
    Key("mode", "method", "How each module's direction is shaped before alpha is chosen: {}.", default="add",
        flag="--mode", commands=("project",), alias_of="method"),
    Key("rank", "rank", "Rank of the written factors: exact (lossless, drops only float64 round-off), N (the optimal "
        "rank-N cut, its error reported exactly), energy:E (smallest rank keeping the share E of the squared norm "
        "of the whole written update).", values="exact | N | energy:E | step-energy:E | keep-base",
        default="exact", flag="--rank", commands=("project", "merge", "refactor"),
        notes=(("project", _RANK_STEP), ("merge", " svd and {space} full need one given."))),
    Key("dose", "dose", "Multiples of alpha: a list (comma-separated on the command line, e.g. 0.5,1,1.456) writes "
        "one output per multiple at OUT-x<k>; a single number writes that multiple at {out} itself.",
        values="[k, ...] or k", flag="--dose", commands=("project",)),
    Key("multiple", "number", "Alpha multiplier of this output (manifests record it; use {dose} in recipes).",
        values="number"),
    Key("out", "folder", "Output adapter folder, written whole or not at all (a dry run needs none).",
        values="folder", flag="--out", commands=COMMANDS),
    Key("dtype", "choice", "Dtype of the written factors; the report says how far rounding moved the update and "
        "the step.", choices=DTYPE_NAMES, default="fp32", flag="--dtype", commands=("project", "merge", "refactor")),
    Key("inputs", "inputs", "Names for this recipe, with paths relative to the recipe file; a pinned sha256 that no "
        "longer matches is an error. Manifests record every input this way.",
        values="{name: path} or {name: {path, sha256, config_sha256}}"),
    Key("allow_missing", "flag", "Read modules missing from an adapter as zero (they are listed in the report).",
        flag="--allow-missing", commands=("project", "merge", "refactor")),
    Key("modules_to_save", "choice", "Adapters that also save full modules (modules_to_save, e.g. a trained "
        "lm_head): refuse them, or drop those full weights and use the LoRA part only (an output then saves none).",
        choices=MODULES_TO_SAVE, default="refuse", flag="--modules-to-save", commands=("project", "merge", "refactor")),
    Key("strict", "flag", "Fail (exit 1, nothing written) on any warning of the report: less than 99% of the step "
        "or of the intended merge survives, the written update misses the step by over 10% of it, dtype rounding, "
        "a step over half the backbone's norm, inputs of different base models.", flag="--strict",
        commands=("project", "merge")),
    Key("name", "text", "Title of the output's model card (default: the folder name).", values="text"),
    Key("allow_base_mismatch", "flag", "Combine adapters whose adapter_config.json declare different base models "
        "(refused otherwise, even when the shapes match); the manifest records it.", flag="--allow-base-mismatch",
        commands=("project", "merge", "refactor")),
    Key("base_model_id", "hub_id", "Hub id of the base model, e.g. Qwen/Qwen3-0.6B, written as "
        "base_model_name_or_path and in the model card (default: base_model_id in vecmerge.yaml, else the inputs' "
        "own, often a local path).", values="ORG/NAME", flag="--base-model-id", commands=COMMANDS),
    Key("base_model", "model_folder", "A local base model folder (transformers, safetensors): DoRA inputs are read "
        "as their effective update m * (W + sBA) / ||W + sBA|| - W against its weights (exact, float64; needed for "
        "DoRA adapters).", values="folder", flag="--base-model", commands=("project", "merge", "refactor")),
    Key("gate", "gate", "Run the seven-condition gate (vecmerge gate) first and write nothing unless every condition "
        "passes; the output's manifest and card carry its table.", values="true | {metric, thresholds...}",
        flag="--gate", commands=("project",),
        notes=(("recipe", " A mapping also overrides vecmerge.yaml's gate: thresholds."),)),
    Key("gate.metric", "text", "With {gate}: the ledger metric for the backbone and evidence conditions.",
        values="metric name", flag="--metric", commands=("project",)),
    Key("models", "models", "A merge's operands (mergekit's key): each an adapter name or expression, its weight "
        "(default 1) and density (default: the recipe's density); a plain string is {{model: ...}}.",
        values="[{model, weight, density}, ...]"),
    Key("only", "pattern", "Only modules whose name matches this regular expression (re.search), e.g. 'mlp' or "
        "'q_proj|v_proj'; project steps only in them (the others keep the backbone), a merge writes only them.",
        values="regex", flag="--only", commands=("project", "merge")),
    Key("exclude", "pattern", "Leave out modules whose name matches this regular expression (re.search), e.g. "
        "'layers\\.0\\.'.", values="regex", flag="--exclude", commands=("project", "merge")),
    Key("protect", "prompt_sets", "Protected prompt sets, NAME=PROMPTS (repeatable; probe's JSON Lines): the direction "
        "is projected off the span of each targeted module's inputs on them at the backbone, D' = s B (A - (A U) U^T) "
        "(exact, the same rank), after {mode} and consensus, so {trust} chooses alpha on D'. Needs {base_model} (or "
        "base_model: in vecmerge.yaml).", values="{NAME: FILE}", flag="--protect", commands=("project",)),
    Key("protect_energy", "energies", "With {protect}: the share E in (0, 1] of each module's protected-input energy "
        "(the trace of G = sum X^T X) that U holds (default 0.9); a list (comma-separated on the command line, e.g. "
        "0.5,0.9,0.99) writes one output per E at OUT-e<E>.", values="E or [E, ...]", flag="--protect-energy",
        commands=("project",)),
    Key("target", "prompt_sets", "With {protect}: prompt sets the step should move, NAME=PROMPTS (repeatable); the "
        "report gives each its kept_change = ||D' X^T|| / ||D X^T|| and says when it keeps no more than a protected "
        "set.", values="{NAME: FILE}", flag="--target", commands=("project",)),
    Key("multipliers", "multipliers", "Per module, the factor of the first pattern its name matches (project: on "
        "the direction before alpha is chosen; merge: on the update).", values="{regex: factor}"),
    Key("per_module", "per_module", "A merge's values per module: a method field (e.g. t, density) or a model's "
        "weight or density (models.0.weight) -> rows [pattern, value]; each module takes the value of the first "
        "pattern its name matches (re.search), else the recipe's own (merge --config writes mergekit's gradients "
        "and filters so).", values="{field: [[regex, value], ...]}"),
)

KEY: dict[str, Key] = {k.name: k for k in KEYS}
TOP_LEVEL: tuple[str, ...] = tuple(k.name for k in KEYS if "." not in k.name)  # the keys a recipe mapping has


def of_kind(kind: str) -> tuple[Key, ...]:
    """The top-level keys read as ``kind``, in table order (a key inside a mapping is its parent's to read)."""
    return tuple(k for k in KEYS if k.kind == kind and "." not in k.name)


def offered(command: str) -> tuple[Key, ...]:
    """The keys whose flag ``command`` offers, in table order (the order of its ``--help``)."""
    return tuple(k for k in KEYS if command in k.commands)


def words(command: str) -> dict[str, str]:
    """``{key: flag}`` for the keys ``command`` sets by flags (an alias's flag spells its key too)."""
    out = {k.name: k.flag for k in offered(command) if k.flag is not None}  # an offered key has a flag
    for k in offered(command):
        if k.alias_of is not None and k.flag is not None:
            out.setdefault(k.alias_of, k.flag)
    return out
