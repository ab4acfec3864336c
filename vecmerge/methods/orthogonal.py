"""``orthogonal``: the part of the direction orthogonal to the backbone (the user's v60 residual)."""

from __future__ import annotations

from .base import Method
from .onto_ref import along
from .registry import register


@register
class Orthogonal(Method):
    """``dir'_m = dir_m - (<dir_m, base_m> / ||base_m||^2) * base_m``, module by module."""

    name = "orthogonal"
    summary = ("step along the part of DIR orthogonal to the backbone, module by module: "
               "dir_m - (<dir_m, base_m> / ||base_m||^2) base_m (v60's residual)")
    operands = ("base", "dir")
    stepped = True

    def module(self, x, params):
        c = along(x.dir, x.base)
        return x.dir - x.base * c if c != 0.0 else x.dir
