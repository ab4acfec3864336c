"""What a merge method is: its recipe fields, its validation, and one module's intended update.

A method turns one module's operands (the recipe's expressions as cores in the module's shared basis,
``subspace.py``) into an update: a *stepped* method (``project``'s modes) returns a direction ``dir'_m`` that the
pipeline scales by the trust region (``base_m + alpha * dir'_m``); any other returns the intended update itself.
A merge method (``operands = ("models",)``) reads ``x.models``, ``x.weights``, ``x.densities`` and, for ``cat``,
``x.terms``. ``space`` says whether it works on the shared cores (``core``) or each module's dense update
(``dense``); ``space_for`` when a recipe field decides. Its ``fields`` declare the recipe keys it reads, from
which the CLI options and the recipe documentation are generated. This module imports no torch.
More: docs/design/methods.md and docs/ARCHITECTURE.md ("Adding a merge method").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

_KINDS = {"float": float, "int": int, "str": str, "bool": bool}


@dataclass(frozen=True)
class Field:
    """One recipe key a method reads (and its CLI flag ``--name-with-dashes``).

    Args:
        name (str): the recipe key, e.g. ``density``. help (str): one line for ``--help`` and the docs.
        kind (str): float | int | str | bool. default: the value when absent (None: optional).
        choices (tuple): allowed values (str fields). low, high (float | None): inclusive bounds.
    """

    name: str
    help: str
    kind: str = "float"
    default: Any = None
    choices: tuple = ()
    low: float | None = None
    high: float | None = None

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def parse(self, value) -> tuple[Any, str | None]:
        """``(value, None)`` converted to the field's kind, or ``(None, problem)`` naming the key and the fix."""
        want = _KINDS[self.kind]
        bad = f"{self.name}={value!r}: " + (f"one of {', '.join(map(str, self.choices))}" if self.choices
                                             else f"a{'n' if self.kind == 'int' else ''} {self.kind}")
        if isinstance(value, bool) != (want is bool):
            return None, bad
        try:
            v = want(value)
        except (TypeError, ValueError):
            return None, bad
        if want in (int, float) and (not math.isfinite(v) or (want is int and v != value)):
            return None, bad
        if self.choices and v not in self.choices:
            return None, bad
        if (self.low is not None and v < self.low) or (self.high is not None and v > self.high):
            lo = "-inf" if self.low is None else f"{self.low:g}"
            hi = "inf" if self.high is None else f"{self.high:g}"
            return None, f"{self.name}={value!r}: between {lo} and {hi}"
        return v, None


@dataclass(frozen=True)
class ModuleOperands:
    """One module's operands as cores of its shared basis (``subspace.InSpan``).

    Args:
        name (str): the module. base, dir, ref (InSpan | None): the recipe's expressions.
        models (tuple[InSpan]): a merge's models, in the recipe's order.
        weights (tuple[float]): each model's weight. densities (tuple[float | None]): each model's own
            density (None: the recipe's ``density``).
        terms (tuple[tuple[tuple[float, LowRank], ...], ...]): per model, its adapters' factors of this
            module with their coefficients in the model's expression.
    """

    name: str
    base: Any = None
    dir: Any = None
    ref: Any = None
    models: tuple = ()
    weights: tuple = ()
    densities: tuple = ()
    terms: tuple = ()


def weighted(weights: tuple, k: float = 1.0) -> dict:
    """``{"models[i]": k * w_i}``: ``linear_terms`` of ``k * sum_i w_i x_i``."""
    return {f"models[{i}]": k * w for i, w in enumerate(weights)}


class Method:
    """Base class of a merge method; subclass it in one file under ``methods/`` (see ARCHITECTURE).

    Class attributes:
        name (str): the recipe's ``mode:`` / ``method:`` value. summary (str): one line for help.
        operands (tuple[str]): recipe expressions it reads, from ``base``, ``dir``, ``ref``; or
            ``("models",)`` for a merge of the recipe's ``models`` list (``vecmerge merge``).
        stepped (bool): returns a direction that the trust region scales (project), or the update itself.
        space (str): ``core`` (exact on the shared cores) or ``dense`` (each module's dense update).
        fields (tuple[Field]): method-specific recipe keys.
        zero_reason (str): why this method may give a module no step (reported with the module).
    """

    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    operands: ClassVar[tuple] = ("base",)
    stepped: ClassVar[bool] = False
    space: ClassVar[str] = "core"
    fields: ClassVar[tuple] = ()
    zero_reason: ClassVar[str] = ""

    def validate(self, recipe) -> list:
        """Problems with ``recipe`` beyond its fields' own checks (all of them; empty when fine): each an
        ``errors.Problem`` naming its keys (``Problem("{method=}x: needs {rank}")``: ``--rank`` on the
        command line, ``rank`` in a recipe), or plain text (shown as it is either way).

        Args:
            recipe (Recipe): the whole recipe, its method's fields in ``recipe.params``.
        """
        return []

    def space_for(self, params: dict) -> str:
        """``core`` or ``dense`` for these parameters (default: the class's ``space``)."""
        return self.space

    def warnings(self, params: dict) -> list[str]:
        """Plain-words warnings about these parameters that are valid but unusual (default: none); the run
        report shows them with the output's own, and ``--strict`` refuses them.

        Args:
            params (dict): the recipe's fields.
        """
        return []

    def prepare(self, modules: dict, params: dict) -> dict:
        """The parameters ``module`` receives, from every module's operands (default: ``params`` as given).

        A method that needs figures over all modules first (``slerp`` with ``slerp_scope: global``)
        computes them here; the result is recorded in the manifest (``resolved.params``).

        Args:
            modules (dict[str, ModuleOperands]): every module's operands. params (dict): the recipe's fields.
        """
        return params

    def module(self, x: ModuleOperands, params: dict):
        """This module's direction (stepped) or intended update (otherwise): a core, or a ``Dense`` matrix.

        Args:
            x (ModuleOperands): the module's operands. params (dict): ``prepare``'s parameters.
        """
        raise NotImplementedError

    def linear_terms(self, weights: tuple, params: dict) -> dict | None:
        """The update (a stepped method: the direction) as fixed coefficients of its operands, ``{key: c}`` with
        keys ``base``, ``dir`` or ``models[i]``, when it is that linear map in every module; None otherwise (the
        default). ``pipeline.bias`` merges the biases of ``lora_bias`` inputs by these coefficients.

        Args:
            weights (tuple[float]): a merge's model weights, in order. params (dict): ``prepare``'s parameters.
        """
        return None

    def factors(self, x: ModuleOperands, params: dict):
        """Factors to write as they are instead of a rank cut of ``module``'s update (None: cut it).

        Args:
            x (ModuleOperands): the module's operands. params (dict): ``prepare``'s parameters.
        """
        return None

    def __repr__(self) -> str:
        return f"<method {self.name}>"
