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
    gate: true                # optional: run the six-condition gate first (vecmerge gate); a mapping
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
its multiplier. Every key is documented for users by ``schema()`` (``vecmerge run --help`` and
docs/RECIPES.md). This module imports no torch.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from types import SimpleNamespace

from .. import methods
from ..errors import RecipeError, few
from ..evidence.gate import GateConfig, GateConfigError
from ..expr import parse
from ..io.parse import ParseError, load_json, load_yaml, safe_path, short
from ..linalg.rank_policy import RankPolicy
from ..options import (
    ALLOW_BASE_MISMATCH_HELP,
    ALLOW_MISSING_HELP,
    BASE_MODEL_ID_HELP,
    DTYPE_HELP,
    DTYPE_NAMES,
    KEEP_BASE_HELP,
    MODULES_TO_SAVE,
    MODULES_TO_SAVE_HELP,
    ON_DISAGREE,
    ON_DISAGREE_HELP,
    RANK_HELP,
    SCOPE_HELP,
    SCOPES,
    STEP_RANK_HELP,
    is_hub_id,
)

MANIFEST_MAX_BYTES = 64 << 20

_KEYS = ("base", "dir", "trust", "trust_scope", "alpha", "consensus", "method", "mode", "rank", "dose", "multiple",
         "out", "dtype", "inputs", "allow_missing", "modules_to_save", "strict", "name", "allow_base_mismatch",
         "base_model_id", "gate", "models", "only", "exclude", "multipliers", "base_model")
_MODEL_KEYS = ("model", "weight", "density")


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
            against its weights (``workspace/dora.py``).
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
        d = {k: v for k, v in d.items() if v is not None and v != {} and k in _KEYS
             and not (k == "allow_base_mismatch" and v is False)}
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
        merging = method is not None and "models" in method.operands
        for key in ("base", "dir"):
            v = data.get(key)
            if v is None:
                if key == "base" and not merging and data.get("models") is None:
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
        for key in ("allow_missing", "strict", "allow_base_mismatch"):
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
        hub = data.get("base_model_id")
        if hub is not None:
            if not is_hub_id(hub):
                p.append(f"base_model_id={short(hub)}: a hub id such as Qwen/Qwen3-0.6B (ORG/NAME), not a local path")
            else:
                kw["base_model_id"] = hub
        if data.get("gate") is not None:
            kw["gate"] = _gate(data["gate"], p)
        if data.get("base_model") is not None:
            try:
                folder = safe_path(str(data["base_model"]), field="base_model", source=source)
                kw["base_model"] = str(root / folder if root is not None and not folder.is_absolute() else folder)
            except ParseError as e:
                p.append(e.problem)
        kw["inputs"] = _inputs(data.get("inputs"), p, root)
        if data.get("models") is not None:
            kw["models"] = _models(data["models"], p)
        for key in ("only", "exclude"):
            if data.get(key) is not None:
                kw[key] = _pattern(key, data[key], p)
        if data.get("multipliers") is not None:
            kw["multipliers"] = _multipliers(data["multipliers"], p)
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
    if not given and data.get("models") is not None and data.get("base") is None:
        problems.append(f"method: missing; models are merged by one of {', '.join(methods.merge_names())} "
                        "(e.g. method: linear)")
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


def _gate(value, problems: list):
    """``gate:`` is true/false, or a mapping of thresholds checked by ``GateConfig.from_dict``."""
    if isinstance(value, bool):
        return value
    if not isinstance(value, dict):
        problems.append(f"gate: {value!r}: true, or a mapping of thresholds such as {{max_trust: 0.015}}")
        return None
    try:
        GateConfig.from_dict(value, source="recipe")
    except GateConfigError as e:
        problems.append(str(e).removeprefix("recipe "))
        return None
    return dict(value)
def _models(raw, problems: list) -> list | None:
    """``models``: a list of expressions, or of ``{model, weight, density}`` (mergekit's ``parameters:`` too)."""
    if not isinstance(raw, list) or not raw:
        problems.append("models: a list of models, e.g. [{model: v28, weight: 0.5}, {model: v51, weight: 0.5}]")
        return None
    out = []
    for i, entry in enumerate(raw):
        where = f"models[{i}]"
        if isinstance(entry, str):
            entry = {"model": entry}
        if not isinstance(entry, dict) or entry.get("model") is None:
            problems.append(f"{where}: a mapping with model (an adapter name or expression), weight, density")
            continue
        entry = dict(entry)
        nested = entry.pop("parameters", None)  # mergekit nests weight and density under parameters
        if isinstance(nested, dict):
            entry = {**nested, **entry}
        elif nested is not None:
            problems.append(f"{where}.parameters: a mapping such as {{weight: 0.5, density: 0.3}}")
        bad = sorted(set(entry) - set(_MODEL_KEYS))
        if bad:
            problems.append(f"{where}: unknown key(s) {bad} (known: {', '.join(_MODEL_KEYS)})")
        model = str(entry["model"])
        try:
            parse(model)
        except Exception as e:
            problems.append(f"{where}.model: {e}")
        item = {"model": model, "weight": 1.0}
        for key in ("weight", "density"):
            v = entry.get(key)
            if v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                problems.append(f"{where}.{key}={v!r}: a finite number")
            elif key == "density" and not 0 < v <= 1:
                problems.append(f"{where}.density={v!r}: a share in (0, 1] of the entries to keep")
            else:
                item[key] = float(v)
        out.append(item)
    return out


def _pattern(key: str, value, problems: list) -> str | None:
    try:
        re.compile(str(value))
    except re.error as e:
        problems.append(f"{key}={value!r}: not a regular expression ({e}); e.g. 'mlp' or 'layers\\.(0|1)\\.'")
        return None
    return str(value)


def _multipliers(raw, problems: list) -> dict | None:
    if not isinstance(raw, dict) or not raw:
        problems.append("multipliers: a mapping of module-name pattern -> factor, e.g. {mlp: 0.5, self_attn: 1.0}")
        return None
    out = {}
    for k, v in raw.items():
        if _pattern(f"multipliers.{k}", k, problems) is None:
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            problems.append(f"multipliers.{k}={v!r}: a finite number")
        else:
            out[str(k)] = float(v)
    return out


def _semantics(data: dict, kw: dict, method) -> list[str]:
    """Rules across keys: what a stepped method needs, what only a step may have, keep-base, the method's own."""
    p = []
    merging = method is not None and "models" in method.operands
    if merging:
        if data.get("models") is None:
            p.append(f"method={method.name}: needs models (the adapters to merge, e.g. models: [v28, v51])")
        for key in ("base", "dir", "trust", "alpha", "consensus", "dose", "gate"):
            if data.get(key) is not None and not (key == "gate" and data[key] is False):
                p.append(f"{key}: method {method.name} merges models; it takes no {key} "
                         f"(vecmerge project steps from a base)")
    elif method is not None and data.get("models") is not None:
        p.append(f"models: only meaningful with a merge method ({', '.join(methods.merge_names())}); "
                 f"method {method.name} reads base" + (" and dir" if method.stepped else ""))
    if method is not None and method.stepped:
        if data.get("dir") is None:
            p.append(f"mode={method.name}: needs dir (the direction to step along)")
        elif data.get("trust") is None and data.get("alpha") is None:
            p.append("trust or alpha: one is needed with dir (e.g. trust: 0.0113)")
    elif method is not None and not merging:
        for key in ("dir", "trust", "alpha", "consensus", "dose", "gate"):
            if data.get(key) is not None and not (key == "gate" and data[key] is False):
                p.append(f"{key}: only meaningful with dir" if key != "dir" else
                         f"dir: method {method.name} takes no direction; use one of "
                         f"{', '.join(methods.names(stepped=True))}")
    if kw.get("trust_scope") == "module" and data.get("trust") is None:
        p.append("trust_scope=module: needs trust")
    if str(kw.get("rank", "")).strip().lower().startswith("step-energy:") and not kw.get("dir"):
        p.append("rank=step-energy: needs dir (it keeps a share of the step's energy; use energy:E without a step)")
    if kw.get("rank") == "keep-base" and not merging:
        if not kw.get("dir"):
            p.append("rank=keep-base: needs dir (it keeps the backbone and appends the step)")
        coeffs = parse(kw["base"]).coeffs if kw.get("base") else {}
        if coeffs and list(coeffs.values()) != [1.0]:
            p.append("rank=keep-base: base must be one adapter name (its factors are kept bit for bit)")
    if merging and kw.get("rank") == "keep-base":
        p.append(f"rank=keep-base: keeps a backbone's factors under a step; method {method.name} has no backbone")
    if method is not None:
        view = SimpleNamespace(**{**{f.name: f.default for f in fields(Recipe)}, **kw}, given=frozenset(data))
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
    root = path.parent
    if isinstance(data, dict) and "recipe" in data and "output" in data:
        root = manifest_root(path.parent, data)
        data = data["recipe"]  # a manifest: re-run its recipe
    return Recipe.from_dict(data, str(path), root=root)


def manifest_root(folder, manifest: dict) -> Path:
    """The folder a manifest's input paths start from: ``folder / manifest["workspace"]``.

    ``workspace`` is the workspace folder relative to the output folder (or absolute); a manifest
    without it has absolute input paths, and its own folder is returned.

    Args:
        folder (str | Path): the output folder holding ``vecmerge.json``. manifest (dict): its content.
    """
    ws = manifest.get("workspace") if isinstance(manifest, dict) else None
    return (Path(folder) / ws).resolve() if isinstance(ws, str) else Path(folder).resolve()


def with_absolute_inputs(manifest: dict, folder) -> dict:
    """A copy of ``manifest`` whose input paths (``inputs`` and ``recipe.inputs``) are absolute.

    Args:
        manifest (dict): a ``vecmerge.json``. folder (str | Path): the output folder it was read from.
    """
    root = manifest_root(folder, manifest)

    def fix(entries):
        if not isinstance(entries, dict):
            return entries
        return {n: {**e, "path": str(root / e["path"])} if isinstance(e, dict) and isinstance(e.get("path"), str)
                else e for n, e in entries.items()}

    out = dict(manifest)  # a section the manifest lacks stays absent (verify names it as missing)
    if "inputs" in manifest:
        out["inputs"] = fix(manifest["inputs"])
    if isinstance(manifest.get("recipe"), dict) and "inputs" in manifest["recipe"]:
        out["recipe"] = dict(manifest["recipe"], inputs=fix(manifest["recipe"]["inputs"]))
    return out


# -- the schema for users (``vecmerge run --help``, docs/RECIPES.md) -------------------------------------
def schema() -> list[tuple[str, str, str]]:
    """``[(key, values, meaning)]`` of every recipe key, the registered methods' own fields included."""
    stepped = methods.names(stepped=True)
    rows = [
        ("base", "expression", "The backbone of a step (project), or the whole update to re-factor (refactor): "
         "adapter names and numbers with + - * / ( ), e.g. v54 or 0.5*v16 + 0.5*v28. Names resolve through "
         "vecmerge.yaml (or inputs); a name that is not listed is a folder of that name."),
        ("dir", "expression", "The direction to step along, e.g. v51 - v28; with it the recipe is a step "
         "(written = base + alpha * dir')."),
        ("trust", "number > 0", "Relative step T: alpha = T*||base||/||dir'||, e.g. 0.0113 (1.13% of the "
         "backbone's norm). trust or alpha is needed with dir."),
        ("trust_scope", " | ".join(SCOPES), SCOPE_HELP),
        ("alpha", "number", "Alpha directly; with trust, trust bounds it (the report says when it clipped)."),
        ("consensus", "{ref, on_disagree, min_agree}", "The consensus gate: ref, an expression such as v54 - v54e2 "
         "(a module agrees when <ref_m, dir_m> > 0); on_disagree: " + ON_DISAGREE_HELP[0].lower()
         + ON_DISAGREE_HELP[1:] + " min_agree: fail below "
         "this share (0..1) of agreeing modules. A plain expression is read as {ref: ...}."),
        ("mode (or method)", " | ".join(stepped), "How each module's direction is shaped before alpha is "
         "chosen (default add): " + "; ".join(f"{m}: {methods.get(m).summary}" for m in stepped) + "."),
        ("rank", "exact | N | energy:E | step-energy:E | keep-base", RANK_HELP + STEP_RANK_HELP + KEEP_BASE_HELP
         + ". step-energy and keep-base need dir."),
        ("dose", "[k, ...] or k", "Multiples of alpha: a list writes one output per multiple at OUT-x<k>; a single "
         "number writes that multiple at out itself."),
        ("out", "folder", "Where to write the adapter (a dry run needs none)."),
        ("dtype", " | ".join(DTYPE_NAMES), DTYPE_HELP + " Default fp32."),
        ("inputs", "{name: path} or {name: {path, sha256, config_sha256}}", "Names for this recipe, with paths "
         "relative to the recipe file; a pinned sha256 that no longer matches is an error. Manifests record "
         "every input this way."),
        ("allow_missing", "true | false", ALLOW_MISSING_HELP),
        ("modules_to_save", " | ".join(MODULES_TO_SAVE), MODULES_TO_SAVE_HELP + " Default refuse."),
        ("allow_base_mismatch", "true | false", ALLOW_BASE_MISMATCH_HELP),
        ("base_model_id", "ORG/NAME", BASE_MODEL_ID_HELP),
        ("base_model", "folder", "A local base model folder (transformers, safetensors): DoRA inputs are read as "
         "their effective update m * (W + sBA) / ||W + sBA|| - W against its weights (exact, float64)."),
        ("strict", "true | false", "Fail (exit 1, write nothing) on any warning of the report."),
        ("name", "text", "Title of the output's model card (default: the folder name)."),
        ("multiple", "number", "Alpha multiplier of this output (manifests record it; use dose in recipes)."),
        ("method", " | ".join(methods.merge_names()), "A classic merge of models (vecmerge merge): "
         + "; ".join(f"{m}: {methods.get(m).summary}" for m in methods.merge_names()) + "."),
        ("models", "[{model, weight, density}, ...]", "A merge's operands (mergekit's key): each an adapter name or "
         "expression, its weight (default 1) and density (default: the recipe's density); a plain string is "
         "{model: ...}."),
        ("only", "regex", "Select the modules whose name matches (re.search); project steps only in them (the "
         "others keep the backbone), a merge writes only them."),
        ("exclude", "regex", "Leave out the modules whose name matches (re.search)."),
        ("multipliers", "{regex: factor}", "Per module, the factor of the first pattern its name matches "
         "(project: on the direction before alpha is chosen; merge: on the update)."),
        ("gate", "true | {metric, thresholds...}", "Run the six-condition gate (vecmerge gate) first and write "
         "nothing unless every condition passes; a mapping overrides vecmerge.yaml's gate: thresholds."),
    ]
    for name, owners in methods.all_fields().items():
        f = owners[0].fields[[x.name for x in owners[0].fields].index(name)]
        values = " | ".join(map(str, f.choices)) if f.choices else f.kind
        default = "" if f.default is None else f" Default {f.default}."
        rows.append((name, values, f"{f.help} (mode {', '.join(m.name for m in owners)}).{default}"))
    return rows


def recipe_help(width: int = 100) -> str:
    """The schema as plain text for ``vecmerge run --help`` (click keeps ``\\b`` blocks as they are)."""
    import textwrap

    lines = ["Recipe keys (YAML; the flags of vecmerge project and refactor build the same recipe):", "", "\b"]
    for key, values, meaning in schema():
        lines.append(f"  {key}: {values}")
        lines += textwrap.wrap(meaning, width, initial_indent="      ", subsequent_indent="      ")
    lines += ["", "\b", "Example (recipes/v58.yaml):", "  base: v54", "  dir: v51 - v28", "  trust: 0.0113",
              "  consensus: {ref: v54 - v54e2, on_disagree: fail}", "  out: out/v58"]
    return "\n".join(lines)


def recipe_markdown() -> str:
    """The schema as the markdown page docs/RECIPES.md (``make readme`` writes it; a test keeps it current)."""
    head = ["# Recipe keys", "",
            "Generated from `vecmerge/recipe/recipe.py` and the registered methods by `make readme`; "
            "`vecmerge run --help` prints the same. A recipe is a YAML mapping; the flags of `vecmerge project` "
            "and `vecmerge refactor` build the same recipe, and every output's `vecmerge.json` holds its recipe "
            "(`vecmerge run OUT/vecmerge.json` re-runs it).", "", "| key | values | meaning |", "|---|---|---|"]
    body = [f"| `{k}` | {v.replace('|', '&#124;')} | {m.replace('|', '&#124;')} |" for k, v, m in schema()]
    example = ["", "Example (`recipes/v58.yaml`):", "", "```yaml", "base: v54", "dir: v51 - v28", "trust: 0.0113",
               "consensus: {ref: v54 - v54e2, on_disagree: fail}", "out: out/v58", "```", ""]
    return "\n".join(head + body + example)
