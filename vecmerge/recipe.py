"""The recipe: one object for CLI flags, YAML files and manifests; validated all at once.

A YAML recipe mirrors the flags of ``vecmerge project``::

    base: v54
    dir: v51 - v28
    trust: 0.0113
    consensus: {ref: v54 - v54e2, on_disagree: fail, min_agree: 1.0}
    mode: add                 # a stepped method: add | onto-ref | orthogonal (vecmerge methods)
    rank: exact               # exact | N | energy:E | keep-base
    dose: [0.5, 1, 1.456]     # optional ladder: one output per multiple of alpha, at OUT-x<k>;
                              # a single number (dose: 1.456) writes that multiple at OUT itself
    out: out/v58
    inputs:                   # optional; paths relative to the recipe; pins are checked
      v54: {path: runs/v54, sha256: "9f0c...", config_sha256: "41aa..."}

Without ``dir`` a recipe re-factors ``base`` (any expression) at the given rank: ``vecmerge refactor``
(method ``expression``). ``method:`` and ``mode:`` name the same thing (a registered method, see
``methods/``); a method's own fields are keys of the recipe too. This module imports no torch.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from types import SimpleNamespace

from . import methods
from .errors import RecipeError, few
from .expr import parse
from .options import DTYPE_NAMES, MODULES_TO_SAVE, ON_DISAGREE, SCOPES, RankPolicy
from .safe_parse import ParseError, load_json, load_yaml, safe_path, short

MANIFEST_MAX_BYTES = 64 << 20

_KEYS = ("base", "dir", "trust", "trust_scope", "alpha", "consensus", "method", "mode", "rank", "dose", "multiple",
         "out", "dtype", "inputs", "allow_missing", "modules_to_save", "strict", "name")


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
        base (str): backbone expression. dir (str | None): direction expression.
        trust (float | None), trust_scope (str), alpha (float | None): the step size.
        consensus (Consensus | None). method (str): a registered method (``add`` with dir, ``expression``
        without). params (dict): the method's own fields. rank (str), dose (list[float] | None),
        multiple (float): alpha multiplier of this output. out (str | None), dtype (str),
        inputs (dict[str, dict]): name -> {path, sha256?}. allow_missing (bool),
        modules_to_save (str): refuse|drop. strict (bool): fail when < 99% of the step survives.
        name (str | None): a title for the output (its model card).
    """

    base: str
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
        d = {k: v for k, v in d.items() if v is not None and v != {} and k in _KEYS}
        return {**d, **params}

    @classmethod
    def from_dict(cls, data, source: str = "recipe", root: Path | None = None) -> Recipe:
        """Validate ``data`` and build a Recipe; every problem is reported at once (RecipeError).

        Args:
            data (dict): the recipe's keys (YAML, flags, or a manifest's ``recipe``).
            source (str): where it came from, for messages. root (Path | None): base of relative input paths.
        """
        if not isinstance(data, dict):
            raise RecipeError(["expected a mapping of keys such as base, dir, trust, out"], source)
        p: list[str] = []
        method = _method(data, p)
        fields = {f.name: f for f in method.fields} if method else {}
        elsewhere = methods.all_fields()
        unknown = []
        for key in sorted(set(data) - set(_KEYS) - set(fields), key=str):
            if key in elsewhere:
                p.append(f"{key}: only meaningful with method {', '.join(m.name for m in elsewhere[key])}")
            else:
                unknown.append(key)
        if unknown:
            shown = few([short(k, 40) for k in unknown])
            p.append(f"unknown key(s) [{shown}] (known: {', '.join(_KEYS + tuple(fields))})")
        kw: dict = {"method": method.name} if method else {}
        params = {}
        for f in fields.values():
            if data.get(f.name) is not None:
                v, problem = f.parse(data[f.name])
                if problem:
                    p.append(problem)
                else:
                    params[f.name] = v
            elif f.default is not None:
                params[f.name] = f.default
        kw["params"] = params
        for key in ("base", "dir"):
            v = data.get(key)
            if v is None:
                if key == "base":
                    p.append("base: missing (the backbone, e.g. 'v54')")
                continue
            try:
                parse(str(v))
                kw[key] = str(v)
            except Exception as e:
                p.append(f"{key}: {e}")
        for key in ("trust", "alpha", "multiple"):
            v = data.get(key)
            if v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                p.append(f"{key}={short(v)}: a finite number")
            elif key == "trust" and not v > 0:
                p.append(f"trust={short(v)}: a relative step > 0, e.g. 0.0113")
            else:
                kw[key] = float(v)
        for key, allowed in (("trust_scope", SCOPES), ("dtype", DTYPE_NAMES), ("modules_to_save", MODULES_TO_SAVE)):
            v = data.get(key)
            if v is not None:
                if str(v) not in allowed:
                    p.append(f"{key}={short(v)}: use one of {', '.join(allowed)}")
                else:
                    kw[key] = str(v)
        if "rank" in data:
            try:
                RankPolicy.parse(data["rank"])
            except RecipeError as e:
                p.extend(e.problems)
            kw["rank"] = str(data["rank"])
        cons = data.get("consensus")
        if cons is not None:
            kw["consensus"] = _consensus(cons, p)
        dose = data.get("dose")
        if isinstance(dose, (int, float)) and not isinstance(dose, bool) and 0 < dose < math.inf:
            kw["multiple"] = float(dose) * kw.get("multiple", 1.0)  # one dose: written at out itself
            dose = None
        if dose is not None:
            if isinstance(dose, str):
                dose = [x for x in dose.split(",") if x.strip()]
            try:
                kw["dose"] = [float(x) for x in dose]
                if not kw["dose"] or any(not 0 < x < math.inf for x in kw["dose"]):
                    raise ValueError
            except (TypeError, ValueError):
                p.append(f"dose={short(data.get('dose'))}: positive multiples of alpha, e.g. [0.5, 1, 1.456]")
        for key in ("allow_missing", "strict"):
            if key in data and data[key] is not None:
                if not isinstance(data[key], bool):
                    p.append(f"{key}={short(data[key])}: true or false")
                else:
                    kw[key] = data[key]
        if data.get("out") is not None:
            try:
                safe_path(str(data["out"]), field="out", source=source)
                kw["out"] = str(data["out"])
            except ParseError as e:
                p.append(e.problem)
        if data.get("name") is not None:
            kw["name"] = str(data["name"])
        kw["inputs"] = _inputs(data.get("inputs"), p, root)
        p += _semantics(data, kw, method)
        if p:
            raise RecipeError(p, source)
        return cls(**kw)


def _method(data: dict, problems: list):
    """The recipe's method: ``method:`` or its alias ``mode:``, default ``add`` with dir, else ``expression``."""
    given = {k: data[k] for k in ("method", "mode") if data.get(k) is not None}
    if len(set(map(str, given.values()))) > 1:
        problems.append(f"method={short(given['method'])} and mode={short(given['mode'])}: give one of them")
        return None
    key, name = next(iter(given.items()), (None, "add" if data.get("dir") is not None else "expression"))
    if str(name) not in methods.names():
        allowed = methods.names(stepped=True) if data.get("dir") is not None else methods.names()
        problems.append(f"{key}={short(name)}: use one of {', '.join(allowed)}")
        return None
    return methods.get(str(name))


def _consensus(cons, problems: list) -> Consensus | None:
    if isinstance(cons, str):
        cons = {"ref": cons}
    if not isinstance(cons, dict) or "ref" not in cons:
        problems.append("consensus: a mapping with ref (e.g. {ref: v54 - v54e2, on_disagree: fail})")
        return None
    bad = sorted(set(cons) - {"ref", "on_disagree", "min_agree"})
    if bad:
        problems.append(f"consensus: unknown key(s) {bad}")
    try:
        parse(str(cons["ref"]))
    except Exception as e:
        problems.append(f"consensus.ref: {e}")
    od = str(cons.get("on_disagree", "fail"))
    if od not in ON_DISAGREE:
        problems.append(f"consensus.on_disagree={short(od)}: use one of {', '.join(ON_DISAGREE)}")
    ma = cons.get("min_agree")
    if ma is not None and (isinstance(ma, bool) or not isinstance(ma, (int, float)) or not 0 <= ma <= 1):
        problems.append(f"consensus.min_agree={short(ma)}: a share between 0 and 1")
        ma = None
    return Consensus(str(cons["ref"]), od, None if ma is None else float(ma))


def _semantics(data: dict, kw: dict, method) -> list[str]:
    """Rules across keys: what a stepped method needs, what only a step may have, keep-base, the method's own."""
    p = []
    if method is not None and method.stepped:
        if data.get("dir") is None:
            p.append(f"mode={method.name}: needs dir (the direction to step along)")
        elif data.get("trust") is None and data.get("alpha") is None:
            p.append("trust or alpha: one is needed with dir (e.g. trust: 0.0113)")
    elif method is not None:
        for key in ("dir", "trust", "alpha", "consensus", "dose"):
            if data.get(key) is not None:
                p.append(f"{key}: only meaningful with dir" if key != "dir" else
                         f"dir: method {method.name} takes no direction; use one of "
                         f"{', '.join(methods.names(stepped=True))}")
    if kw.get("trust_scope") == "module" and data.get("trust") is None:
        p.append("trust_scope=module: needs trust")
    if kw.get("rank") == "keep-base":
        if not kw.get("dir"):
            p.append("rank=keep-base: needs dir (it keeps the backbone and appends the step)")
        coeffs = parse(kw["base"]).coeffs if kw.get("base") else {}
        if coeffs and list(coeffs.values()) != [1.0]:
            p.append("rank=keep-base: base must be one adapter name (its factors are kept bit for bit)")
    if method is not None:
        view = SimpleNamespace(**{**{f.name: f.default for f in fields(Recipe)}, **kw})
        p += method.validate(view)
    return p


def _inputs(raw, problems: list, root: Path | None) -> dict:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        problems.append("inputs: a mapping of name -> path or {path, sha256}")
        return {}
    out = {}
    for name, v in raw.items():
        entry = {"path": v} if isinstance(v, str) else v
        if not isinstance(entry, dict) or "path" not in entry:
            problems.append(f"inputs.{name}: a path or {{path, sha256}}")
            continue
        try:
            path = safe_path(entry["path"], field=f"inputs.{name}.path", source="recipe")
        except ParseError as e:
            problems.append(e.problem)
            continue
        if root is not None and not path.is_absolute():
            path = root / path
        out[str(name)] = {"path": str(path)}
        for key in ("sha256", "config_sha256"):
            pin = entry.get(key)
            if pin is None:
                continue
            if not isinstance(pin, str) or not re.fullmatch(r"[0-9a-f]{64}", pin):
                problems.append(f"inputs.{name}.{key}: 64 hex digits, quoted (\"...\") so YAML keeps them a string")
            else:
                out[str(name)][key] = pin
    return out


def load(path) -> Recipe:
    """Read a YAML recipe, or the ``recipe`` of a ``vecmerge.json`` manifest (JSON).

    Both are read strictly and bounded (``safe_parse``: no YAML anchors or aliases, no NaN, limited
    size and depth), so a hostile file is one RecipeError line, never a blow-up.
    """
    path = Path(path)
    if path.is_dir() and (path / "vecmerge.json").is_file():
        path = path / "vecmerge.json"
    if not path.is_file():
        raise RecipeError([f"no such file: {path}"], str(path))
    try:
        data = load_json(path, max_bytes=MANIFEST_MAX_BYTES) if path.suffix == ".json" else load_yaml(path)
    except ParseError as e:
        raise RecipeError([e.problem], e.source if e.line is None else f"{e.source}:{e.line}") from None
    if isinstance(data, dict) and "recipe" in data and "output" in data:
        data = data["recipe"]  # a manifest: re-run its recipe
    return Recipe.from_dict(data, str(path), root=path.parent)
