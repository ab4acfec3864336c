"""lm-eval groups: a group's items are its subtasks' items, and a group shares one eval environment with them.

    leaves       the tasks under a group (``group_subtasks``, nested groups followed; a cycle is cut)
    items        each ``--log_samples`` row of a leaf task T of group G is also an item of ``G/METRIC[/FILTER]``,
                 id ``T/DOC_ID``, counting toward the sub-score named by G's direct subtask that holds T: so
                 ``compare v54 v60 --metric facts/acc`` pairs the group's documents, and every sub-score its own
    environment the top group's: per field, the one value its leaf tasks share, else ``{task: value}``
                 (canonical JSON; sha256 of it past ``MAX_VALUE_CHARS``); the group, its nested groups and
                 its tasks all carry it, so they have one environment id
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import replace

from ..ledger.environment import MAX_VALUE_CHARS
from ..ledger.records import Entry

Env = tuple[tuple[str, str], ...]


def _children(group: str, groups: Mapping) -> list[str]:
    tasks = groups.get(group)
    return [t for t in tasks if isinstance(t, str)] if isinstance(tasks, list) else []


def leaves(group: str, groups: Mapping) -> list[str]:
    """The tasks (not groups) under ``group``, depth first, each once.

    Args:
        group (str): a group name. groups (Mapping[str, list[str]]): lm-eval's ``group_subtasks``.
    """
    out, seen, stack = [], {group}, list(reversed(_children(group, groups)))
    while stack:
        t = stack.pop()
        if t in seen:
            continue
        seen.add(t)
        if _children(t, groups):
            stack.extend(reversed(_children(t, groups)))
        else:
            out.append(t)
    return out


def _tops(groups: Mapping) -> dict[str, str]:
    """Every task and group under a top group (one no other group lists) -> that top group."""
    listed = {t for g in groups for t in _children(g, groups)}
    out: dict[str, str] = {}
    for top in [g for g in groups if g not in listed and _children(g, groups)]:
        stack = [top]
        while stack:
            t = stack.pop()
            if t not in out:
                out[t] = top
                stack.extend(_children(t, groups))
    return out


def shared_env(envs: Mapping[str, Env]) -> Env:
    """One environment for tasks ``envs`` (task -> its fields): per field, the shared value, else the mapping."""
    keys = sorted({k for env in envs.values() for k, _ in env})
    fields: list[tuple[str, str]] = []
    for key in keys:
        values = {task: dict(env).get(key) for task, env in sorted(envs.items())}
        distinct = set(values.values())
        if len(distinct) == 1 and (only := next(iter(distinct))) is not None:  # a key of some env: never None
            fields.append((key, only))
            continue
        text = json.dumps({t: v for t, v in values.items() if v is not None}, sort_keys=True, separators=(",", ":"),
                          ensure_ascii=True)
        if len(text) > MAX_VALUE_CHARS:
            text = "sha256:" + hashlib.sha256(text.encode("ascii")).hexdigest()
        fields.append((key, text))
    return tuple(fields)


def group_environments(groups: object, env_of: Callable[[str], Env]) -> dict[str, Env]:
    """Every task and group under a top group -> the top group's shared environment (``shared_env`` of its
    leaves' ``env_of(task)``)."""
    if not isinstance(groups, Mapping):
        return {}
    tops = _tops(groups)
    shared = {top: shared_env({t: env_of(t) for t in leaves(top, groups)}) for top in set(tops.values())}
    return {task: shared[top] for task, top in tops.items()}


def with_group_environments(entries: list[Entry], groups: object, env_of: Callable[[str], Env]) -> list[Entry]:
    """``entries`` with each task's and group's environment replaced by its top group's (``group_environments``)."""
    envs = group_environments(groups, env_of)
    return [replace(e, env=envs[task]) if (task := e.metric.split("/")[0]) in envs else e for e in entries]


def group_items(entries: list[Entry], groups: object) -> list[Entry]:
    """Item-level entries of every group, from its leaf tasks' item entries (module docstring).

    Args:
        entries (list[Entry]): item-level entries of tasks (``TASK/METRIC[/FILTER]``, item = the doc id).
        groups (Mapping[str, list[str]] | None): lm-eval's ``group_subtasks``.
    """
    if not isinstance(groups, Mapping):
        return []
    out = []
    for group in groups:
        direct: dict[str, str] = {}
        for child in _children(group, groups):
            for leaf in (leaves(child, groups) if _children(child, groups) else [child]):
                direct.setdefault(leaf, child)
        for e in entries:
            task, _, rest = e.metric.partition("/")
            if e.item is not None and task in direct:
                out.append(replace(e, metric=f"{group}/{rest}", item=f"{task}/{e.item}", subscore=direct[task]))
    return out
