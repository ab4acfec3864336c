"""The recipe: one object for CLI flags, YAML files and manifests; validated all at once.

A YAML recipe mirrors the flags of ``vecmerge project``::

    base: v54
    dir: v51 - v28
    trust: 0.0113
    consensus: {ref: v54 - v54e2, on_disagree: fail, min_agree: 1.0}
    mode: add                 # add | onto-ref | orthogonal
    rank: exact               # exact | N | energy:E | keep-base
    dose: [0.5, 1, 1.456]     # optional ladder: one output per multiple of alpha, at OUT-x<k>;
                              # a single number (dose: 1.456) writes that multiple at OUT itself
    out: out/v58
    inputs:                   # optional; paths relative to the recipe; pins are checked
      v54: {path: runs/v54, sha256: "9f0c...", config_sha256: "41aa..."}

Without ``dir`` a recipe re-factors ``base`` (any expression) at the given rank: ``vecmerge refactor``.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml

from .errors import RecipeError
from .expr import parse
from .refactor import RankPolicy
from .surgery import MODES, SCOPES

ON_DISAGREE = ("fail", "drop", "keep")
DTYPE_NAMES = ("fp32", "bf16", "fp16")
_KEYS = ("base", "dir", "trust", "trust_scope", "alpha", "consensus", "mode", "rank", "dose", "multiple",
         "out", "dtype", "inputs", "allow_missing", "modules_to_save", "strict", "base_model", "name")


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
        consensus (Consensus | None), mode (str), rank (str), dose (list[float] | None),
        multiple (float): alpha multiplier of this output. out (str | None), dtype (str),
        inputs (dict[str, dict]): name -> {path, sha256?}. allow_missing (bool),
        modules_to_save (str): refuse|drop. strict (bool): fail when < 99% of the step survives.
    """

    base: str
    dir: str | None = None
    trust: float | None = None
    trust_scope: str = "global"
    alpha: float | None = None
    consensus: Consensus | None = None
    mode: str = "add"
    rank: str = "exact"
    dose: list | None = None
    multiple: float = 1.0
    out: str | None = None
    dtype: str = "fp32"
    inputs: dict = field(default_factory=dict)
    allow_missing: bool = False
    modules_to_save: str = "refuse"
    strict: bool = False
    base_model: str | None = None
    name: str | None = None

    @property
    def kind(self) -> str:
        return "project" if self.dir else "refactor"

    def to_dict(self) -> dict:
        d = asdict(self)
        return {k: v for k, v in d.items() if v is not None and v != {} and k in _KEYS}

    @classmethod
    def from_dict(cls, data, source: str = "recipe", root: Path | None = None) -> Recipe:
        """Validate ``data`` and build a Recipe; every problem is reported at once (RecipeError)."""
        if not isinstance(data, dict):
            raise RecipeError(["expected a mapping of keys such as base, dir, trust, out"], source)
        p: list[str] = []
        unknown = sorted(set(data) - set(_KEYS))
        if unknown:
            p.append(f"unknown key(s) {unknown} (known: {', '.join(_KEYS)})")
        kw = {}
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
                p.append(f"{key}={v!r}: a finite number")
            elif key == "trust" and not v > 0:
                p.append(f"trust={v!r}: a relative step > 0, e.g. 0.0113")
            else:
                kw[key] = float(v)
        for key, allowed in (("trust_scope", SCOPES), ("mode", MODES), ("dtype", DTYPE_NAMES),
                             ("modules_to_save", ("refuse", "drop"))):
            v = data.get(key)
            if v is not None:
                if str(v) not in allowed:
                    p.append(f"{key}={v!r}: use one of {', '.join(allowed)}")
                else:
                    kw[key] = str(v)
        if "rank" in data:
            r = str(data["rank"])
            if r != "keep-base":
                try:
                    RankPolicy.parse(r)
                except RecipeError as e:
                    p.extend(e.problems)
            kw["rank"] = r
        cons = data.get("consensus")
        if cons is not None:
            if isinstance(cons, str):
                cons = {"ref": cons}
            if not isinstance(cons, dict) or "ref" not in cons:
                p.append("consensus: a mapping with ref (e.g. {ref: v54 - v54e2, on_disagree: fail})")
            else:
                bad = sorted(set(cons) - {"ref", "on_disagree", "min_agree"})
                if bad:
                    p.append(f"consensus: unknown key(s) {bad}")
                try:
                    parse(str(cons["ref"]))
                except Exception as e:
                    p.append(f"consensus.ref: {e}")
                od = str(cons.get("on_disagree", "fail"))
                if od not in ON_DISAGREE:
                    p.append(f"consensus.on_disagree={od!r}: use one of {', '.join(ON_DISAGREE)}")
                ma = cons.get("min_agree")
                if ma is not None and (isinstance(ma, bool) or not isinstance(ma, (int, float)) or not 0 <= ma <= 1):
                    p.append(f"consensus.min_agree={ma!r}: a share between 0 and 1")
                kw["consensus"] = Consensus(str(cons["ref"]), od, None if ma is None else float(ma))
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
                p.append(f"dose={data.get('dose')!r}: positive multiples of alpha, e.g. [0.5, 1, 1.456]")
        for key in ("allow_missing", "strict"):
            if key in data and data[key] is not None:
                if not isinstance(data[key], bool):
                    p.append(f"{key}={data[key]!r}: true or false")
                else:
                    kw[key] = data[key]
        for key in ("out", "base_model", "name"):
            if data.get(key) is not None:
                kw[key] = str(data[key])
        kw["inputs"] = _inputs(data.get("inputs"), p, root)
        if data.get("dir") is not None:
            if data.get("trust") is None and data.get("alpha") is None:
                p.append("trust or alpha: one is needed with dir (e.g. trust: 0.0113)")
        else:
            for key in ("trust", "alpha", "consensus", "dose"):
                if data.get(key) is not None:
                    p.append(f"{key}: only meaningful with dir")
        if kw.get("trust_scope") == "module" and data.get("trust") is None:
            p.append("trust_scope=module: needs trust")
        if kw.get("mode") == "onto-ref" and cons is None:
            p.append("mode=onto-ref: needs consensus.ref (the reference trajectory)")
        if kw.get("rank") == "keep-base":
            if not kw.get("dir"):
                p.append("rank=keep-base: needs dir (it keeps the backbone and appends the step)")
            coeffs = parse(kw["base"]).coeffs if kw.get("base") else {}
            if coeffs and list(coeffs.values()) != [1.0]:
                p.append("rank=keep-base: base must be one adapter name (its factors are kept bit for bit)")
        if p:
            raise RecipeError(p, source)
        return cls(**kw)


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
        path = Path(str(entry["path"]))
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
    """Read a YAML recipe, or the ``recipe`` of a ``vecmerge.json`` manifest (JSON)."""
    path = Path(path)
    if path.is_dir() and (path / "vecmerge.json").is_file():
        path = path / "vecmerge.json"
    if not path.is_file():
        raise RecipeError([f"no such file: {path}"], str(path))
    text = path.read_text()
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as e:
        raise RecipeError([f"cannot parse: {str(e).splitlines()[0]}"], str(path)) from None
    if isinstance(data, dict) and "recipe" in data and "output" in data:
        data = data["recipe"]  # a manifest: re-run its recipe
    return Recipe.from_dict(data, str(path), root=path.parent)
