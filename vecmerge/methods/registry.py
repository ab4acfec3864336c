"""The registry itself: method name -> instance. Method files register here; ``methods`` re-exports it."""

from __future__ import annotations

from ..errors import RecipeError
from .base import Method

_REGISTRY: dict[str, Method] = {}


def register(method):
    """Add ``method`` (a Method subclass or instance) under its ``name``; returns what it was given.

    Args:
        method (type[Method] | Method): the method; a class is instantiated once.
    """
    inst = method() if isinstance(method, type) else method
    if not inst.name:
        raise ValueError(f"{method!r} has no name")
    _REGISTRY[inst.name] = inst
    return method


def unregister(name: str) -> None:
    """Remove a method (tests that register a toy one)."""
    _REGISTRY.pop(name, None)


def get(name: str) -> Method:
    """The method called ``name``; RecipeError listing the known ones otherwise."""
    if name not in _REGISTRY:
        raise RecipeError([f"method={name!r}: use one of {', '.join(names())}"])
    return _REGISTRY[name]


def names(stepped: bool | None = None) -> tuple[str, ...]:
    """Registered method names (only stepped ones, or only others, when asked), in registration order."""
    return tuple(n for n, m in _REGISTRY.items() if stepped is None or m.stepped == stepped)


def merge_names() -> tuple[str, ...]:
    """Registered methods that merge the recipe's ``models`` list (``vecmerge merge --method``)."""
    return tuple(n for n, m in _REGISTRY.items() if "models" in m.operands)


def all_fields() -> dict[str, list[Method]]:
    """``{field name: [methods declaring it]}`` over every registered method."""
    out: dict[str, list[Method]] = {}
    for m in _REGISTRY.values():
        for f in m.fields:
            out.setdefault(f.name, []).append(m)
    return out
