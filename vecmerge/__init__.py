"""vecmerge: surgery on LoRA adapters with exact factored algebra, audits and verified PEFT output.

The public API: everything a script needs is importable from here, lazily (``import vecmerge`` and
``vecmerge --help`` do not pay for torch), and visible to type checkers::

    import vecmerge as vm

    ws = vm.Workspace()                                   # reads ./vecmerge.yaml if present
    step = ws.evaluate("v51 - v28")                       # TaskVector, exact, never dense
    report = vm.run(vm.load_recipe("recipes/v58.yaml"), ws)   # RunReport: the outputs written, their figures
    assert vm.verify_output("out/v58").passed

Anything not listed in ``__all__`` is internal and may move between releases.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .version import __version__

# The public API, written once: the imports below are what type checkers and IDEs see; at run time nothing is
# imported until a name is used (``__getattr__``), and ``_API`` and ``__all__`` are read from these lines.
if TYPE_CHECKING:
    from .analysis.audit import AuditReport as AuditReport
    from .analysis.audit import PairwiseReport as PairwiseReport
    from .analysis.audit import audit_pairwise as audit_pairwise
    from .analysis.audit import audit_trajectories as audit_trajectories
    from .analysis.inspect import AdapterSummary as AdapterSummary
    from .analysis.inspect import describe as describe
    from .demo.run import run_demo as run_demo
    from .demo.trajectories import make_trajectories as make_trajectories
    from .errors import AdapterError as AdapterError
    from .errors import AlignmentError as AlignmentError
    from .errors import CheckFailed as CheckFailed
    from .errors import EvidenceError as EvidenceError
    from .errors import ExpressionError as ExpressionError
    from .errors import LineageError as LineageError
    from .errors import MergeArgumentError as MergeArgumentError
    from .errors import ModelError as ModelError
    from .errors import NumericError as NumericError
    from .errors import OutputError as OutputError
    from .errors import Problem as Problem
    from .errors import RecipeError as RecipeError
    from .errors import SVDInputError as SVDInputError
    from .errors import UsageError as UsageError
    from .errors import VecmergeError as VecmergeError
    from .errors import WorkspaceError as WorkspaceError
    from .evidence.gate.gate import GateConfig as GateConfig
    from .evidence.gate.gate import GateFacts as GateFacts
    from .evidence.gate.gate import GateResult as GateResult
    from .evidence.gate.gate import evaluate_gate as evaluate_gate
    from .evidence.importers.importers import import_files as import_files
    from .evidence.judge.compare import compare_records as compare_records
    from .evidence.ledger.ledger import Ledger as Ledger
    from .evidence.stats.noise import pooled_noise as pooled_noise
    from .evidence.stats.stats import runs_by_model as runs_by_model
    from .evidence.stats.stats import summarize_records as summarize_records
    from .expr import LinearForm as LinearForm
    from .expr import parse as parse
    from .linalg.lowrank import LowRank as LowRank
    from .linalg.lowrank import combine as combine
    from .linalg.rank_policy import RankPolicy as RankPolicy
    from .linalg.rankcut import cut as cut
    from .methods.base import Field as Field
    from .methods.base import Method as Method
    from .methods.registry import get as get_method  # noqa: F401 (public under another name)
    from .methods.registry import register as register
    from .models.extract_write import ExtractReport as ExtractReport
    from .models.extract_write import extract as extract
    from .models.fuse import FuseReport as FuseReport
    from .models.fuse import fuse as fuse
    from .peft.adapter import Adapter as Adapter
    from .peft.format import LoraConfig as LoraConfig
    from .peft.write import write_adapter as write_adapter
    from .pipeline.evaluation import evaluate as evaluate
    from .pipeline.runner import RunReport as RunReport
    from .pipeline.runner import run as run
    from .recipe.load import load as load_recipe  # noqa: F401 (public under another name)
    from .recipe.recipe import Consensus as Consensus
    from .recipe.recipe import Recipe as Recipe
    from .verify.checks.output import verify_output as verify_output
    from .verify.report import VerifyReport as VerifyReport
    from .workspace.names import Workspace as Workspace
    from .workspace.taskvector import TaskVector as TaskVector
    from .workspace.taskvector import linear_combination as linear_combination


def _read_api() -> dict[str, tuple[str, str]]:
    """``{public name: (owner module, the owner's own name)}`` from the ``TYPE_CHECKING`` imports of this file."""
    import ast
    from pathlib import Path

    tree = ast.parse(Path(__file__).read_text(encoding="utf-8"))
    block = next(n for n in tree.body if isinstance(n, ast.If) and getattr(n.test, "id", "") == "TYPE_CHECKING")
    return {a.asname or a.name: (str(imp.module), a.name)
            for imp in block.body if isinstance(imp, ast.ImportFrom) for a in imp.names}


_API = _read_api()
__all__ = sorted(_API) + ["__version__"]


def __getattr__(name: str):
    if name in _API:
        import importlib

        owner, own_name = _API[name]
        value = getattr(importlib.import_module(f".{owner}", __name__), own_name)
        globals()[name] = value  # once imported, a plain attribute
        return value
    raise AttributeError(f"module 'vecmerge' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_API))
