"""One key's value: read and checked by the key's ``kind`` (``keys.Key``), each problem naming its key.

``READERS[kind](key, value, reading)`` returns the value the Recipe keeps (None: keep nothing) and adds
every problem it finds to ``reading.problems`` (``errors.Problem``: recipe or flag words). Rules across
keys are ``validate.py``'s. This module imports no torch.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeGuard

from ..errors import Problem
from ..evidence.gate.gate import GateConfig, GateConfigError
from ..expr import parse
from ..io.parse import ParseError, safe_path, short
from ..linalg.rank_policy import RankPolicy
from ..options import is_hub_id
from .keys import KEY, Key

MODEL_KEYS = ("model", "weight", "density")
PATTERN_FIX = "e.g. 'mlp' or 'layers\\.(0|1)\\.'"


@dataclass
class Reading:
    """What the readers share: the problems found so far, the Recipe's values so far, where inputs start.

    Args:
        problems (list[Problem]). kw (dict): the Recipe's keyword arguments read so far.
        root (Path | None): the folder relative input paths start from.
    """

    problems: list = field(default_factory=list)
    kw: dict = field(default_factory=dict)
    root: Path | None = None

    def add(self, problem: Problem) -> None:
        self.problems.append(problem)


def _real(v: object) -> TypeGuard[float]:
    return not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v)


def expression(key: Key, value: object, r: Reading) -> str | None:
    """An adapter expression (``v54``, ``v51 - v28``): its text, or None when it does not parse."""
    try:
        parse(str(value))
    except Exception as e:
        r.add(Problem.about(key.name, "{}", e))
        return None
    return str(value)


def number(key: Key, value: object, r: Reading) -> float | None:
    """A finite number (above ``key.above`` when it has one)."""
    if not _real(value):
        r.add(Problem.about(key.name, "a finite number", given=short(value)))
    elif key.above is not None and not value > key.above:
        r.add(Problem.about(key.name, key.hint, given=short(value)))
    else:
        return float(value)
    return None


def choice(key: Key, value: object, r: Reading) -> str | None:
    """One of ``key.choices``."""
    if str(value) not in key.choices:
        r.add(Problem.about(key.name, "use one of {}", ", ".join(key.choices), given=short(value)))
        return None
    return str(value)


def flag(key: Key, value: object, r: Reading) -> bool | None:
    """true or false."""
    if not isinstance(value, bool):
        r.add(Problem.about(key.name, "true or false", given=short(value)))
        return None
    return value


def folder(key: Key, value: object, r: Reading) -> str | None:
    """A folder to write (checked by ``safe_path``: no control characters, a sane length)."""
    try:
        safe_path(str(value), field=key.name, source="recipe")
    except ParseError as e:
        r.add(Problem.led_by(key.name, e.problem))
        return None
    return str(value)


def model_folder(key: Key, value: object, r: Reading) -> str | None:
    """A folder to read (a base model), relative to ``r.root`` like the inputs (``safe_path`` checked)."""
    try:
        path = safe_path(str(value), field=key.name, source="recipe")
    except ParseError as e:
        r.add(Problem.led_by(key.name, e.problem))
        return None
    return str(r.root / path if r.root is not None and not path.is_absolute() else path)


def text(key: Key, value: object, r: Reading) -> str:
    """Any text (a number is read as its text)."""
    return str(value)


def hub_id(key: Key, value: object, r: Reading) -> str | None:
    """A Hugging Face Hub id, ``ORG/NAME``, never a local path."""
    if not is_hub_id(value):
        r.add(Problem.about(key.name, "a hub id such as Qwen/Qwen3-0.6B (ORG/NAME), not a local path",
                            given=short(value)))
        return None
    return str(value)  # a hub id is text


def pattern(key: Key, value: object, r: Reading) -> str | None:
    """A regular expression over module names (``re.search``)."""
    try:
        re.compile(str(value))
    except re.error as e:
        r.add(Problem.about(key.name, "not a regular expression ({}); " + PATTERN_FIX, e, given=repr(value)))
        return None
    return str(value)


def rank(key: Key, value: object, r: Reading) -> str:
    """A rank policy (``RankPolicy.parse``); its text is kept even when invalid (cross-key rules read it)."""
    from ..errors import RecipeError

    try:
        RankPolicy.parse(value)
    except RecipeError as e:
        r.problems.extend(Problem.led_by(key.name, q) for q in e.problems)
    return str(value)


def dose(key: Key, value: object, r: Reading) -> list[float] | None:
    """A ladder of multiples of alpha (a list, or comma-separated text); one number multiplies ``multiple``."""
    if _real(value) and 0 < value < math.inf:
        r.kw["multiple"] = float(value) * r.kw.get("multiple", 1.0)  # one dose: written at out itself
        return None
    # float() refuses what is not a number (TypeError, ValueError: caught below)
    items: Any = [x for x in value.split(",") if x.strip()] if isinstance(value, str) else value
    try:
        ladder = [float(x) for x in items]
        if not ladder or any(not 0 < x < math.inf for x in ladder):
            raise ValueError
    except (TypeError, ValueError):
        r.add(Problem.about(key.name, "positive multiples of alpha, e.g. [0.5, 1, 1.456]", given=short(value)))
        return None
    return ladder


def consensus(key: Key, value: object, r: Reading) -> dict | None:
    """``{ref, on_disagree, min_agree}`` (a plain expression is ``{ref: ...}``), as the Consensus's fields."""
    cons = {"ref": value} if isinstance(value, str) else value
    if not isinstance(cons, dict) or "ref" not in cons:
        r.add(Problem("{consensus}: a mapping with ref (e.g. {{ref: v54 - v54e2, on_disagree: fail}})"))
        return None
    parts = [k.name.split(".", 1)[1] for k in KEY.values() if k.name.startswith("consensus.")]
    bad = sorted(set(cons) - set(parts))
    if bad:
        r.add(Problem("{consensus}: unknown key(s) {}", bad))
    expression(KEY["consensus.ref"], cons["ref"], r)
    on = KEY["consensus.on_disagree"]
    od = str(cons.get("on_disagree", on.default))
    if od not in on.choices:
        r.add(Problem.about(on.name, "use one of {}", ", ".join(on.choices), given=short(od)))
    ma = cons.get("min_agree")
    if ma is not None and (not isinstance(ma, (int, float)) or isinstance(ma, bool) or not 0 <= ma <= 1):
        r.add(Problem.about("consensus.min_agree", "a share between 0 and 1", given=short(ma)))
        ma = None
    return {"ref": str(cons["ref"]), "on_disagree": od, "min_agree": None if ma is None else float(ma)}


def gate(key: Key, value: object, r: Reading) -> bool | dict | None:
    """true/false, or a mapping of thresholds checked by ``GateConfig.from_dict`` (the gate's own rules)."""
    if isinstance(value, bool):
        return value
    if not isinstance(value, dict):
        r.add(Problem("{gate:}{}: true, or a mapping of thresholds such as {{max_trust: 0.015}}", repr(value)))
        return None
    try:
        GateConfig.from_dict(value, source="recipe")
    except GateConfigError as e:
        r.add(Problem.led_by(key.name, str(e).removeprefix("recipe ")))
        return None
    return dict(value)


def inputs(key: Key, value: object, r: Reading) -> dict[str, dict[str, str]]:
    """``{name: path}`` or ``{name: {path, sha256?, config_sha256?}}``, paths relative to ``r.root``."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        r.add(Problem("{inputs}: a mapping of name -> path or {{path, sha256}}"))
        return {}
    out = {}
    for name, v in value.items():
        entry = {"path": v} if isinstance(v, str) else v
        if not isinstance(entry, dict) or "path" not in entry:
            r.add(Problem("{inputs}.{}: a path or {{path, sha256}}", name))
            continue
        try:
            path = safe_path(entry["path"], field=f"inputs.{name}.path", source="recipe")
        except ParseError as e:
            r.add(Problem.led_by(key.name, e.problem))
            continue
        if r.root is not None and not path.is_absolute():
            path = r.root / path
        out[str(name)] = {"path": str(path)}
        for pin_key in ("sha256", "config_sha256"):
            pin = entry.get(pin_key)
            if pin is None:
                continue
            if not isinstance(pin, str) or not re.fullmatch(r"[0-9a-f]{64}", pin):
                r.add(Problem("{inputs}.{}.{}: 64 hex digits, quoted (\"...\") so YAML keeps them a string",
                              name, pin_key))
            else:
                out[str(name)][pin_key] = pin
    return out


def models(key: Key, value: object, r: Reading) -> list | None:
    """A merge's operands: expressions, or ``{model, weight, density}`` (mergekit's ``parameters:`` too)."""
    if not isinstance(value, list) or not value:
        r.add(Problem("{models}: a list of models, e.g. [{{model: v28, weight: 0.5}}, {{model: v51, weight: 0.5}}]"))
        return None
    out = []
    for i, entry in enumerate(value):
        if isinstance(entry, str):
            entry = {"model": entry}
        if not isinstance(entry, dict) or entry.get("model") is None:
            r.add(Problem("{models}[{}]: a mapping with model (an adapter name or expression), weight, density", i))
            continue
        entry = dict(entry)
        nested = entry.pop("parameters", None)  # mergekit nests weight and density under parameters
        if isinstance(nested, dict):
            entry = {**nested, **entry}
        elif nested is not None:
            r.add(Problem("{models}[{}].parameters: a mapping such as {{weight: 0.5, density: 0.3}}", i))
        bad = sorted(set(entry) - set(MODEL_KEYS))
        if bad:
            r.add(Problem("{models}[{}]: unknown key(s) {} (known: {})", i, bad, ", ".join(MODEL_KEYS)))
        model = str(entry["model"])
        try:
            parse(model)
        except Exception as e:
            r.add(Problem("{models}[{}].model: {}", i, e))
        item = {"model": model, "weight": 1.0}
        for part in ("weight", "density"):
            v = entry.get(part)
            if v is None:
                continue
            if not _real(v):
                r.add(Problem("{models}[{}].{}={}: a finite number", i, part, repr(v)))
            elif part == "density" and not 0 < v <= 1:
                r.add(Problem("{models}[{}].density={}: a share in (0, 1] of the entries to keep", i, repr(v)))
            else:
                item[part] = float(v)
        out.append(item)
    return out


def multipliers(key: Key, value: object, r: Reading) -> dict[str, float] | None:
    """``{module-name pattern: factor}``: the first pattern a module's name matches gives its factor."""
    if not isinstance(value, dict) or not value:
        r.add(Problem("{multipliers}: a mapping of module-name pattern -> factor, e.g. {{mlp: 0.5, self_attn: 1.0}}"))
        return None
    out = {}
    for k, v in value.items():
        try:
            re.compile(str(k))
        except re.error as e:
            r.add(Problem("{multipliers}.{}={}: not a regular expression ({}); " + PATTERN_FIX, k, repr(k), e))
            continue
        if not _real(v):
            r.add(Problem("{multipliers}.{}={}: a finite number", k, repr(v)))
        else:
            out[str(k)] = float(v)
    return out


SET_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")


def prompt_sets(key: Key, value: object, r: Reading) -> dict[str, str] | None:
    """``{NAME: FILE}`` of prompt files (or ``NAME=FILE`` texts, as the repeated flag gives them), each file
    relative to ``r.root`` like the inputs."""
    pairs: list[tuple[Any, Any]] | None = list(value.items()) if isinstance(value, dict) else None
    if pairs is None and isinstance(value, (list, tuple, str)):
        pairs = []
        for t in map(str, [value] if isinstance(value, str) else value):
            name, eq, path = t.partition("=")
            pairs.append((name, path if eq else None))
    out: dict[str, str] = {}
    if not pairs:
        r.add(Problem.about(key.name, "NAME=PROMPTS pairs, e.g. {{math: prompts/math.jsonl}}", given=short(value)))
        return None
    for name, path in pairs:
        name = str(name)
        if path is None or not SET_NAME.fullmatch(name) or str(path) == "":
            r.add(Problem("{" + key.name + "}: " + "{}: give NAME=PROMPTS (a name such as math, then the prompt file)",
                          short(name if path is None else f"{name}={path}", 60)))
            continue
        if name in out:
            r.add(Problem("{" + key.name + "}: " + "{} is named twice; give each set once", repr(name)))
            continue
        try:
            p = safe_path(str(path), field=f"{key.name}.{name}", source="recipe")
        except ParseError as e:
            r.add(Problem.led_by(key.name, e.problem))
            continue
        out[name] = str(r.root / p if r.root is not None and not p.is_absolute() else p)
    return out or None


def energies(key: Key, value: object, r: Reading) -> list[float] | None:
    """One share E in (0, 1], or a list of them (comma-separated text on the command line)."""
    items: list[Any] | tuple[Any, ...] = [x for x in value.split(",") if x.strip()] if isinstance(value, str) \
        else (value if isinstance(value, (list, tuple)) else [value])
    try:
        out = [float(x) for x in items if not isinstance(x, bool)]
        if not out or len(out) != len(items) or any(not 0.0 < x <= 1.0 for x in out):
            raise ValueError
    except (TypeError, ValueError):
        r.add(Problem.about(key.name, "a share E in (0, 1] of the protected energy, or a list, e.g. 0.5,0.9,0.99",
                            given=short(value)))
        return None
    if len(set(out)) != len(out):
        r.add(Problem.about(key.name, "each E once", given=short(value)))
        return None
    return out


PER_MODEL_KEY = re.compile(r"models\.(\d+)\.(weight|density)")


def per_module(key: Key, value: object, r: Reading) -> dict[str, list[list]] | None:
    """``{field | models.I.weight | models.I.density: [[pattern, value], ...]}``: per-module values, each module
    taking the value of the first pattern its name matches (``re.search``), else the recipe's own."""
    from .. import methods

    if not isinstance(value, dict) or not value:
        r.add(Problem("{per_module}: a mapping of a method field or models.I.weight -> [[pattern, value], ...]"))
        return None
    method = methods.get(r.kw["method"]) if r.kw.get("method") else None
    own = {f.name: f for f in method.fields} if method else {}
    out = {}
    for k, rows in value.items():
        m = PER_MODEL_KEY.fullmatch(str(k))
        if m is None and str(k) not in own:
            r.add(Problem("{per_module}.{}: not a field of this method ({}) nor models.I.weight / models.I.density",
                          short(k, 40)[1:-1] if isinstance(k, str) else short(k, 40), ", ".join(own) or "none"))
            continue
        if m is not None and int(m.group(1)) >= len(r.kw.get("models") or ()):
            r.add(Problem("{per_module}.{}: there is no model {} (models has {})", k, m.group(1),
                          len(r.kw.get("models") or ())))
            continue
        if not isinstance(rows, list) or not rows:
            r.add(Problem("{per_module}.{}: a list of [pattern, value] rows", k))
            continue
        good = []
        for row in rows:
            if not isinstance(row, (list, tuple)) or len(row) != 2 or not isinstance(row[0], str):
                r.add(Problem("{per_module}.{}: a row is [pattern, value], given {}", k, short(row, 40)))
                break
            try:
                re.compile(row[0])
            except re.error as e:
                r.add(Problem("{per_module}.{}: {} is not a regular expression ({})", k, repr(row[0]), e))
                break
            if m is not None:
                ok = _real(row[1]) and (m.group(2) == "weight" or 0 < row[1] <= 1)
                v, problem = (float(row[1]), None) if ok else (None, f"{m.group(2)}={short(row[1])}: " + (
                    "a finite number" if m.group(2) == "weight" else "a share in (0, 1]"))
            else:
                v, problem = own[str(k)].parse(row[1])
            if problem:
                r.add(Problem("{per_module}.{}: {}", k, problem))
                break
            good.append([row[0], v])
        else:
            out[str(k)] = good
    return out


READERS = {"expression": expression, "number": number, "choice": choice, "rank": rank, "consensus": consensus,
           "dose": dose, "flag": flag, "folder": folder, "model_folder": model_folder, "text": text, "hub_id": hub_id,
           "gate": gate,
           "inputs": inputs, "models": models, "pattern": pattern, "multipliers": multipliers, "per_module": per_module,
           "prompt_sets": prompt_sets, "energies": energies}
