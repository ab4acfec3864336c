"""The search space, and a candidate: its parameters, its ``project`` recipe and that recipe's sha256.

A candidate's step is ``t * ||backbone|| / ||D'|| * D'`` (the recipe's ``trust: t``), with ``D'`` per module::

    D_m  = mult_m * sum_i w_i dir_i,m             mult_m = depth(l) * type(m), 0 where excluded
    D'_m = D_m (I - U U^T)                        U: protected inputs' span at energy E (off: D' = D)

    depth(l) = 1 + slope * (2 l / (L - 1) - 1)    (LiNeS: a dose growing, slope > 0, or shrinking with the layer)
    type(m)  = min(1, 2 (1 - mix)) attention, min(1, 2 mix) MLP   (mix 0.5: both 1)

Parameters: ``trust`` in [trust_max / 1000, trust_max] (sampled on a log scale); ``w<i>`` in [0, 1] per direction
(with two or more); ``slope`` in [-1, 1] (``depth``); ``mix`` in [0, 1] (``types``); ``x<j>`` in {0, 1} per
exclusion pattern; ``energy`` among ``energies`` (0: no protection) with protected sets. Values are rounded to 6
significant digits, so that a parameter set has one recipe and one hash.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field

from ..errors import UsageError

DIGITS = 6
ENERGIES = (0.0, 0.5, 0.9, 0.99)  # 0: the plain step, no protection
TRUST_RANGE = 1000.0  # trust in [trust_max / TRUST_RANGE, trust_max]
_LAYER = re.compile(r"^\d+$")
_ATTENTION = re.compile(r"attn|attention", re.IGNORECASE)


def rounded(x: float) -> float:
    """``x`` to ``DIGITS`` significant digits (0.0 stays 0.0)."""
    return float(f"{float(x):.{DIGITS}g}")


@dataclass(frozen=True)
class Dim:
    """One parameter: a float in ``[lo, hi]`` or one of ``choices``."""

    name: str
    lo: float = 0.0
    hi: float = 1.0
    choices: tuple = ()


@dataclass(frozen=True)
class Space:
    """What a search may vary, and the fixed parts of every candidate's recipe.

    Args:
        base (str): the backbone expression. dirs (tuple[str, ...]): direction expressions. modules (tuple[str, ...]):
        the adapters' modules. trust_max (float): the largest relative step. protect, target (tuple[tuple[str, str]]):
        (name, file) pairs. base_model (str): the model folder. depth, types (bool): the depth schedule, the
        attention/MLP mix. exclude (tuple[str, ...]): module patterns each candidate may leave out.
        energies (tuple[float, ...]): protection energies (0: none), used with ``protect``.
        fingerprint (dict): input name -> content sha256, prompt file -> sha256, the base model's config sha256.
    """

    base: str
    dirs: tuple
    modules: tuple
    trust_max: float
    protect: tuple = ()
    target: tuple = ()
    base_model: str | None = None
    depth: bool = False
    types: bool = False
    exclude: tuple = ()
    energies: tuple = ENERGIES
    fingerprint: dict = field(default_factory=dict, compare=False)

    def dims(self) -> list[Dim]:
        """The parameters, in a fixed order (the samplers' and the grid's)."""
        out = [Dim("trust", rounded(self.trust_max / TRUST_RANGE), self.trust_max)]
        if len(self.dirs) > 1:
            out += [Dim(f"w{i}") for i in range(len(self.dirs))]
        if self.protect:
            out.append(Dim("energy", choices=tuple(self.energies)))
        if self.depth:
            out.append(Dim("slope", -1.0, 1.0))
        if self.types:
            out.append(Dim("mix"))
        out += [Dim(f"x{j}", choices=(0, 1)) for j in range(len(self.exclude))]
        return out

    def to_dict(self) -> dict:
        return {"base": self.base, "dirs": list(self.dirs), "trust_max": self.trust_max,
                "protect": dict(self.protect), "target": dict(self.target), "base_model": self.base_model,
                "depth": self.depth, "types": self.types, "exclude": list(self.exclude),
                "energies": list(self.energies) if self.protect else [],
                "dims": [d.name for d in self.dims()]}


@dataclass(frozen=True, eq=False)
class Candidate:
    """One point of the space: ``params`` (rounded), its ``project`` recipe (a dict), its sha256 and multipliers.

    ``problem`` says why it has no step (every module excluded or multiplied by 0), else None.
    """

    params: dict
    recipe: dict
    sha256: str
    multipliers: dict
    problem: str | None = None

    @property
    def key(self) -> str:
        """The ledger's model name of this candidate's evaluations."""
        return f"search-{self.sha256[:16]}"


def plain_params(space: Space, trust: float) -> dict:
    """The plain dose at ``trust``: every weight 1, no protection (energy 0), no depth or type factor, nothing
    excluded."""
    extra = {"energy": 0.0, "slope": 0.0, "mix": 0.5}
    return {d.name: rounded(trust) if d.name == "trust" else extra.get(d.name, 0 if d.choices else 1.0)
            for d in space.dims()}


def is_plain(params: dict) -> bool:
    """Whether ``params`` is a plain dose (``plain_params`` at some trust)."""
    extra = {"energy": 0.0, "slope": 0.0, "mix": 0.5}
    return all(v == extra.get(k, 0 if k.startswith("x") else 1.0) for k, v in params.items() if k != "trust")


def layer_and_group(module: str) -> tuple[int | None, str | None]:
    """``(layer index, "<prefix up to the sub-block>")`` of a module name (``model.layers.3.self_attn.q_proj`` ->
    ``(3, "model.layers.3.self_attn")``); ``(None, None)`` without a numbered part."""
    parts = module.split(".")
    for i, p in enumerate(parts[:-1]):
        if _LAYER.match(p):
            return int(p), ".".join(parts[:min(i + 2, len(parts) - 1)])
    return None, None


def module_multiplier(module: str, layers: int, slope: float | None, mix: float | None) -> float:
    """``depth(l) * type(m)`` of the module docstring (1 for a part the space does not vary)."""
    layer, _ = layer_and_group(module)
    f = 1.0
    if slope is not None and layer is not None and layers > 1:
        f *= 1.0 + slope * (2.0 * layer / (layers - 1) - 1.0)
    if mix is not None:
        f *= min(1.0, 2.0 * (1.0 - mix)) if _ATTENTION.search(module) else min(1.0, 2.0 * mix)
    return rounded(f)


def _dir_expr(space: Space, weights: list[float]) -> str:
    if len(space.dirs) == 1:
        return space.dirs[0]
    return " + ".join(f"{w:.{DIGITS}g} * ({d})" for w, d in zip(weights, space.dirs) if w != 0.0) or "0"


def candidate(space: Space, params: dict) -> Candidate:
    """The candidate of ``params`` (every dim of ``space.dims()``), its recipe and hash.

    Args:
        space (Space): the search space. params (dict): name -> value.
    """
    p = {d.name: (params[d.name] if d.choices else rounded(params[d.name])) for d in space.dims()}
    weights = [p.get(f"w{i}", 1.0) for i in range(len(space.dirs))]
    patterns = [pat for j, pat in enumerate(space.exclude) if p.get(f"x{j}")]
    exclude = "|".join(f"(?:{pat})" for pat in patterns) or None
    rx = re.compile(exclude) if exclude else None
    selected = [m for m in space.modules if not (rx and rx.search(m))]
    layers = 1 + max((layer_and_group(m)[0] or 0 for m in space.modules), default=0)
    mult: dict[str, float] = {}
    groups: dict[str, float] = {}
    for m in selected:
        f = module_multiplier(m, layers, p.get("slope"), p.get("mix"))
        mult[m] = f
        group = layer_and_group(m)[1]
        if f != 1.0:
            groups["^" + re.escape(group) + r"\." if group is not None else "^" + re.escape(m) + "$"] = f
    recipe: dict = {"base": space.base, "dir": _dir_expr(space, weights), "trust": p["trust"],
                    "trust_scope": "global", "rank": "exact"}
    if groups:
        recipe["multipliers"] = groups
    if exclude:
        recipe["exclude"] = exclude
    energy = p.get("energy", 0.0)
    if space.protect and energy:
        recipe.update(protect=dict(space.protect), protect_energy=[energy], base_model=space.base_model)
        if space.target:
            recipe["target"] = dict(space.target)
    problem = None
    if not selected:
        problem = "every module is excluded"
    elif not any(f != 0.0 for f in mult.values()) or not any(weights):
        problem = "the direction is zero (every multiplier or weight is 0)"
    text = json.dumps({"recipe": recipe, "inputs": space.fingerprint}, sort_keys=True)
    return Candidate(p, recipe, hashlib.sha256(text.encode()).hexdigest(), mult, problem)


def check_space(space: Space) -> None:
    """UsageError for a space that cannot be searched (one line each)."""
    if not space.trust_max > 0:
        raise UsageError(f"--trust-max {space.trust_max}: give a relative step > 0, e.g. 0.02")
    for pat in space.exclude:
        try:
            rx = re.compile(pat)
        except re.error as e:
            raise UsageError(f"--exclude-choice {pat!r}: not a regular expression ({e})") from None
        hit = [m for m in space.modules if rx.search(m)]
        if not hit or len(hit) == len(space.modules):
            raise UsageError(f"--exclude-choice {pat!r}: matches {'none' if not hit else 'all'} of the "
                             f"{len(space.modules)} modules; give a pattern that leaves some out")
    bad = [e for e in space.energies if not 0.0 <= e <= 1.0]
    if bad:
        raise UsageError(f"--energies {bad[0]}: each energy must be in [0, 1] (0: no protection)")
