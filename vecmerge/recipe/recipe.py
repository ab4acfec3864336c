"""The recipe: one object for CLI flags, YAML files and manifests; validated all at once.

A YAML recipe mirrors the flags of ``vecmerge project``::

    base: v54
    dir: v51 - v28
    trust: 0.0113
    consensus: {ref: v54 - v54e2, on_disagree: fail, min_agree: 1.0}
    mode: add                 # a stepped method: add | onto-ref | orthogonal (vecmerge methods)
    rank: exact               # exact | N | energy:E | step-energy:E | keep-base
    dose: [0.5, 1, 1.456]     # optional ladder: one output per multiple of alpha, at OUT-x<k>;
                              # a single number (dose: 1.456) writes that multiple at OUT itself
    out: out/v58
    gate: true                # optional: run the seven-condition gate first (vecmerge gate); a mapping
                              # ({metric: acc, max_trust: 0.02}) also overrides vecmerge.yaml's gate: thresholds
    inputs:                   # optional; paths relative to the recipe; pins are checked
      v54: {path: runs/v54, sha256: "9f0c...", config_sha256: "41aa..."}

Without ``dir`` a recipe re-factors ``base`` (any expression) at the given rank: ``vecmerge refactor``
(method ``expression``). ``method:`` and ``mode:`` name the same thing (a registered method, see
``methods/``); a method's own fields are keys of the recipe too.

A classic merge (``vecmerge merge``) lists its operands under ``models`` (mergekit's key; ``inputs``
stays the pinned adapter folders), each an adapter name or expression with its own weight and density::

    method: ties              # linear | cat | svd | ties | dare_linear | dare_ties | magnitude_prune | slerp
    models:
      - {model: v28, weight: 0.5, density: 0.3}
      - {model: v51 - v28, weight: 0.5}      # weight defaults to 1; density to the recipe's density
    density: 0.5
    space: full               # full (each module's dense update) | core (its shared low-rank core)
    rank: 32
    out: out/ties

Any recipe may select modules and weight them by name (``re.search`` on module names)::

    only: 'mlp'               # only modules matching this; exclude: modules matching this are left out
    multipliers: {mlp: 0.5}   # per module: the first matching pattern's factor (1 where none matches)

``project`` steps only in the selected modules (the others keep the backbone) and multiplies each
module's direction before alpha is chosen; a merge writes only the selected modules, each update times
its multiplier. Every key is a row of ``keys.KEYS`` (its flag, its check, its help; ``docs.schema()``
lists them for ``vecmerge run --help`` and docs/RECIPES.md); ``validate.py`` checks a recipe, ``load.py``
reads one from a file. This module imports no torch.
"""

from __future__ import annotations

from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from types import SimpleNamespace

from .. import methods
from ..errors import RecipeError
from ..linalg.rank_policy import RankPolicy
from . import validate
from .keys import TOP_LEVEL


@dataclass
class Consensus:
    """The consensus gate. Args: ref (str): expression; on_disagree (str): fail|drop|keep;
    min_agree (float | None): fail below this share of agreeing modules."""

    ref: str
    on_disagree: str = "fail"
    min_agree: float | None = None


@dataclass
class Recipe:
    """Everything a merge needs; see the module docstring for the keys.

    Args:
        base (str | None): backbone expression (None for a merge of ``models``). dir (str | None): direction.
        trust (float | None), trust_scope (str), alpha (float | None): the step size.
        consensus (Consensus | None). method (str): a registered method (``add`` with dir, ``expression``
        without). params (dict): the method's own fields. rank (str), dose (list[float] | None),
        multiple (float): alpha multiplier of this output. out (str | None), dtype (str),
        inputs (dict[str, dict]): name -> {path, sha256?}. allow_missing (bool),
        modules_to_save (str): refuse|drop. strict (bool): fail (write nothing) on any warning.
        name (str | None): a title for the output (its model card).
        allow_base_mismatch (bool): combine adapters whose declared base models differ (recorded).
        base_model_id (str | None): the base model's hub id, written to the output's config and card.
        gate (bool | dict | None): run the gate before writing (a mapping: threshold overrides, ``metric``).
        models (list[dict] | None): a merge's operands, ``{model: expression, weight: float, density?: float}``.
        only, exclude (str | None): module-name patterns (``re.search``) selecting the modules.
        multipliers (dict[str, float] | None): module-name pattern -> factor (the first match applies).
        base_model (str | None): a local base model folder: DoRA inputs are read as their effective update
            against its weights (``workspace/dora.py``); with ``protect``, the model the protected inputs are read on.
        protect, target (dict[str, str] | None): prompt sets, name -> JSON Lines file (``analysis/protect.py``).
        protect_energy (list[float] | None): the energies E of the protected span (one output each; default 0.9).
        per_module (dict | None): a merge's per-module values, ``{field or models.I.weight: [[pattern, value]]}``
            (the first pattern a module's name matches; mergekit's gradients and filters).
    """

    base: str | None = None
    dir: str | None = None
    trust: float | None = None
    trust_scope: str = "global"
    alpha: float | None = None
    consensus: Consensus | None = None
    method: str = "expression"
    params: dict = field(default_factory=dict)
    rank: str = "exact"
    dose: list | None = None
    multiple: float = 1.0
    out: str | None = None
    dtype: str = "fp32"
    inputs: dict = field(default_factory=dict)
    allow_missing: bool = False
    modules_to_save: str = "refuse"
    strict: bool = False
    name: str | None = None
    allow_base_mismatch: bool = False
    base_model_id: str | None = None
    gate: bool | dict | None = None
    models: list | None = None
    only: str | None = None
    exclude: str | None = None
    multipliers: dict | None = None
    base_model: str | None = None
    protect: dict | None = None
    protect_energy: list | None = None
    target: dict | None = None
    per_module: dict | None = None

    @property
    def kind(self) -> str:
        """``project`` for a stepped method, ``refactor`` for an expression, else ``merge``."""
        m = methods.get(self.method)
        return "project" if m.stepped else ("refactor" if m.name == "expression" else "merge")

    @property
    def rank_policy(self) -> RankPolicy:
        return RankPolicy.parse(self.rank)

    def to_dict(self) -> dict:
        """The recipe as YAML/JSON keys (``from_dict`` reads it back); method fields at the top level."""
        d = asdict(self)
        params = d.pop("params")
        d = {k: v for k, v in d.items() if v is not None and v != {} and k in TOP_LEVEL
             and not (k == "allow_base_mismatch" and v is False)}
        return {**d, **params}

    @classmethod
    def from_dict(cls, data: object, source: str = "recipe", root: Path | None = None) -> Recipe:
        """Validate ``data`` and build a Recipe; every problem is reported at once (RecipeError).

        Args:
            data (dict): the recipe's keys (YAML, flags, or a manifest's ``recipe``).
            source (str): where it came from, for messages. root (Path | None): base of relative input paths.
        """
        if not isinstance(data, dict):
            raise RecipeError(["expected a mapping of keys such as base, dir, trust, out"], source)
        kw, problems, method = validate.read(data, root)
        if kw.get("consensus") is not None:
            kw["consensus"] = Consensus(**kw["consensus"])
        if method is not None:  # the method's own rules see the recipe as it will be
            defaults = {f.name: f.default for f in fields(cls) if f.default is not MISSING}
            problems += method.validate(SimpleNamespace(**{**defaults, **kw}, given=frozenset(data)))
        if problems:
            raise RecipeError(problems, source)
        return cls(**kw)
