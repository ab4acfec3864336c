"""The recipe: one object for CLI flags, YAML files and manifests; validated all at once.

A YAML recipe mirrors the flags of ``vecmerge project``::

    base: v54
    dir: v51 - v28
    trust: 0.0113
    consensus: {ref: v54 - v54e2, on_disagree: fail, min_agree: 1.0}
    out: out/v58

Every key is a row of ``keys.KEYS`` (its flag, its check, its help); ``validate.py`` checks a recipe,
``load.py`` reads one from a file. Without ``dir`` a recipe re-factors ``base``; ``models`` lists a classic
merge's operands. This module imports no torch. Fuller examples (doses, gates, merges, module selection):
docs/design/recipe.md and docs/RECIPES.md.
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
