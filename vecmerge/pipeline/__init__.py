"""The one path from a Recipe to written adapters: inputs -> evaluate -> build -> write.

- ``inputs``: open every adapter the recipe names, check its sha256 pins, plan the output folders;
- ``evaluate``: one shared basis per module, the operands as cores, consensus, the method, the step
  (a frozen ``Evaluation``);
- ``build``: per module the intended update, the rank cut (``rankcut.cut``), the dtype rounding and
  the figures (a ``BuiltOutput``);
- ``manifest``: ``vecmerge.json`` and the model card of one output;
- ``run``: all of it for every output of a recipe, warnings, and the writes (``export``).

``verify`` re-derives an output through the same ``evaluate`` and the same method object.
"""

from .evaluation import Evaluation, evaluate, intended, intended_core
from .runner import RunReport, run

__all__ = ["Evaluation", "evaluate", "intended", "intended_core", "RunReport", "run"]
