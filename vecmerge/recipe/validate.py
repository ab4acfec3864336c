"""A whole recipe checked at once: its method, unknown keys, every key's value, and the rules across keys.

``read(data)`` returns the Recipe's keyword arguments and every problem found (``errors.Problem``, naming
its keys); the method's own ``validate`` runs on the result (``recipe.Recipe.from_dict``). The values
are checked kind by kind in ``ORDER`` (``values.READERS``), each kind's keys in the table's order.
This module imports no torch.
"""

from __future__ import annotations

from pathlib import Path

from .. import methods
from ..errors import Problem, few
from ..expr import parse
from ..io.parse import short
from .keys import TOP_LEVEL, of_kind
from .values import READERS, Reading

# the order in which the kinds of keys are checked, so that problems are listed in it
ORDER = ("expression", "number", "choice", "rank", "consensus", "dose", "flag", "folder", "model_folder", "text",
         "hub_id", "gate", "inputs", "models", "pattern", "multipliers", "per_module", "prompt_sets", "energies")
# keys only a step has: a merge of models or a re-factored expression takes none of them
STEP_ONLY = ("dir", "trust", "alpha", "consensus", "dose", "gate", "protect", "protect_energy", "target")


def read(data: dict, root: Path | None = None) -> tuple[dict, list, methods.Method | None]:
    """``(kw, problems, method)``: the Recipe's keyword arguments, every problem, and the recipe's method.

    Args:
        data (dict): the recipe's keys (YAML, flags, or a manifest's ``recipe``).
        root (Path | None): the folder relative input paths start from.
    """
    r = Reading(root=root)
    method = _method(data, r)
    own = {f.name: f for f in method.fields} if method else {}
    _unknown(data, own, r)
    kw = r.kw
    if method:
        kw["method"] = method.name
    params = {}
    for f in own.values():
        if data.get(f.name) is not None:
            v, problem = f.parse(data[f.name])
            if problem:
                r.add(Problem.led_by(f.name, problem))
            else:
                params[f.name] = v
        elif f.default is not None:
            params[f.name] = f.default
    kw["params"] = params
    merging = method is not None and "models" in method.operands
    for kind in ORDER:
        for key in of_kind(kind):
            value = data.get(key.name)
            if value is not None or kind == "inputs" or (kind == "rank" and key.name in data):
                got = READERS[kind](key, value, r)
                if got is not None:
                    kw[key.name] = got
            elif key.name == "base" and not merging and data.get("models") is None:
                r.add(Problem("{base}: missing (the backbone, e.g. 'v54')"))
    return kw, r.problems + across(data, kw, method), method


def _method(data: dict, r: Reading) -> methods.Method | None:
    """The recipe's method: ``method:`` or its alias ``mode:``, default ``add`` with dir, else ``expression``."""
    given = {k: data[k] for k in ("method", "mode") if data.get(k) is not None}
    if len(set(map(str, given.values()))) > 1:
        r.add(Problem("{method=}{} and {mode=}{}: give one of them", short(given["method"]), short(given["mode"])))
        return None
    if not given and data.get("models") is not None and data.get("base") is None:
        r.add(Problem("{method}: missing; models are merged by one of {} (e.g. {method:}linear)",
                      ", ".join(methods.merge_names())))
        return None
    key, name = next(iter(given.items()), ("method", "add" if data.get("dir") is not None else "expression"))
    if str(name) not in methods.names():
        allowed = methods.names(stepped=True) if data.get("dir") is not None else methods.names()
        r.add(Problem.about(key, "use one of {}", ", ".join(allowed), given=short(name)))
        return None
    return methods.get(str(name))


def _unknown(data: dict, own: dict, r: Reading) -> None:
    """Keys of another method (say which), and keys of none (listed with the known ones)."""
    elsewhere = methods.all_fields()
    unknown = []
    for key in sorted(set(data) - set(TOP_LEVEL) - set(own), key=str):
        if key in elsewhere:
            r.add(Problem.about(key, "only meaningful with method {}", ", ".join(m.name for m in elsewhere[key])))
        else:
            unknown.append(key)
    if unknown:
        r.add(Problem("unknown key(s) [{}] (known: {})", few([short(k, 40) for k in unknown]),
                      ", ".join(TOP_LEVEL + tuple(own))))


def across(data: dict, kw: dict, method: methods.Method | None) -> list[Problem]:
    """Rules across keys: what a merge or a step needs, what only a step may have, trust_scope, keep-base.

    Args:
        data (dict): the recipe as given. kw (dict): its values as read (``read``). method (Method | None).
    """
    p: list[Problem] = []
    merger = method if method is not None and "models" in method.operands else None
    merging = merger is not None

    def given(key: str) -> bool:
        return data.get(key) is not None and not (key == "gate" and data[key] is False)

    if merger is not None:
        if data.get("models") is None:
            p.append(Problem("{method=}{}: needs {models} (the adapters to merge, e.g. {models:}[v28, v51])",
                             merger.name))
        for key in ("base", *STEP_ONLY):
            if given(key):
                k = "{" + key + "}"
                p.append(Problem(k + ": method {} merges models; it takes no " + k + " (vecmerge project steps from "
                                 "a base)", merger.name))
    elif method is not None and data.get("models") is not None:
        p.append(Problem("{models}: only meaningful with a merge method ({}); method {} reads {base}"
                         + (" and {dir}" if method.stepped else ""), ", ".join(methods.merge_names()), method.name))
    if method is not None and method.stepped:
        if data.get("dir") is None:
            p.append(Problem("{mode=}{}: needs {dir} (the direction to step along)", method.name))
        elif data.get("trust") is None and data.get("alpha") is None:
            p.append(Problem("{trust} or {alpha}: one is needed with {dir} (e.g. {trust:}0.0113)"))
    elif method is not None and not merging:
        for key in STEP_ONLY:
            if given(key) and key == "dir":
                p.append(Problem("{dir}: method {} takes no direction; use one of {}", method.name,
                                 ", ".join(methods.names(stepped=True))))
            elif given(key):
                p.append(Problem.about(key, "only meaningful with {dir}"))
    for key in ("protect_energy", "target"):
        if given(key) and not given("protect"):
            p.append(Problem("{" + key + "}: only meaningful with {protect} (the prompt sets to hold, e.g. "
                             "{protect:}style=prompts/style.jsonl)"))
    if data.get("per_module") is not None and not merging:
        p.append(Problem("{per_module}: only meaningful with a merge of {models}"))
    if kw.get("trust_scope") == "module" and data.get("trust") is None:
        p.append(Problem("{trust_scope=}module: needs {trust}"))
    if str(kw.get("rank", "")).strip().lower().startswith("step-energy:") and not kw.get("dir"):
        p.append(Problem("{rank=}step-energy: needs {dir} (it keeps a share of the step's energy; use energy:E "
                         "without a step)"))
    if kw.get("rank") == "keep-base" and not merging:
        if not kw.get("dir"):
            p.append(Problem("{rank=}keep-base: needs {dir} (it keeps the backbone and appends the step)"))
        coeffs = parse(kw["base"]).coeffs if kw.get("base") else {}
        if coeffs and list(coeffs.values()) != [1.0]:
            p.append(Problem("{rank=}keep-base: base must be one adapter name (its factors are kept bit for bit)"))
    if merger is not None and kw.get("rank") == "keep-base":
        p.append(Problem("{rank=}keep-base: keeps a backbone's factors under a step; method {} has no backbone",
                         merger.name))
    return p
