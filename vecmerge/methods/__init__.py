"""The method registry: every way vecmerge turns operands into an update, one file per method.

``get(name)`` returns a registered method; ``register`` adds one (a class or an instance), which is
all a new method needs besides its file (every module in this package is imported here, so a new
``methods/<name>.py`` that decorates its class with ``@register`` is found without an edit elsewhere).
"""

from __future__ import annotations

import importlib
import pkgutil

from .base import Field, Method, ModuleOperands
from .registry import all_fields, get, merge_names, names, register, unregister

for _info in pkgutil.iter_modules(__path__):
    if _info.name not in ("base", "registry"):
        importlib.import_module(f"{__name__}.{_info.name}")

__all__ = ["Field", "Method", "ModuleOperands", "register", "unregister", "get", "names", "merge_names", "all_fields"]
