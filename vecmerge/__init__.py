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

# name -> the module that owns it (relative to the package)
_API = {
    # adapters and their algebra
    "Adapter": "peft.adapter", "LoraConfig": "peft.format", "write_adapter": "peft.write",
    "LowRank": "linalg.lowrank", "combine": "linalg.lowrank",
    "RankPolicy": "linalg.rank_policy", "cut": "linalg.rankcut",
    "TaskVector": "workspace.taskvector", "linear_combination": "workspace.taskvector",
    "Workspace": "workspace.names",
    "parse": "expr", "LinearForm": "expr",
    # recipes, the pipeline and verify
    "Recipe": "recipe.recipe", "Consensus": "recipe.recipe", "load_recipe": "recipe.load",
    "run": "pipeline.runner", "RunReport": "pipeline.runner", "evaluate": "pipeline.evaluation",
    "verify_output": "verify.checks.output", "VerifyReport": "verify.report",
    # measuring
    "describe": "analysis.inspect", "AdapterSummary": "analysis.inspect",
    "audit_trajectories": "analysis.audit", "audit_pairwise": "analysis.audit",
    "AuditReport": "analysis.audit", "PairwiseReport": "analysis.audit",
    # whole models
    "extract": "models.extract_write", "fuse": "models.fuse", "ExtractReport": "models.extract_write",
    "FuseReport": "models.fuse",
    # merge methods
    "Method": "methods.base", "Field": "methods.base", "register": "methods.registry",
    "get_method": "methods.registry",
    # evidence
    "Ledger": "evidence.ledger.ledger", "evaluate_gate": "evidence.gate.gate", "GateConfig": "evidence.gate.gate",
    "GateFacts": "evidence.gate.gate", "GateResult": "evidence.gate.gate",
    "import_files": "evidence.importers.importers", "summarize_records": "evidence.stats.stats",
    "runs_by_model": "evidence.stats.stats", "compare_records": "evidence.judge.compare",
    "pooled_noise": "evidence.stats.noise",
    # the toy trajectories the demo trains (tiny random Qwen3 + LoRA), for trying things out
    "make_trajectories": "demo.trajectories", "run_demo": "demo.run",
    # errors
    "VecmergeError": "errors", "UsageError": "errors", "AdapterError": "errors", "AlignmentError": "errors",
    "ExpressionError": "errors", "WorkspaceError": "errors", "RecipeError": "errors", "NumericError": "errors",
    "ModelError": "errors", "OutputError": "errors", "MergeArgumentError": "errors", "SVDInputError": "errors",
    "EvidenceError": "errors", "LineageError": "errors", "CheckFailed": "errors", "Problem": "errors",
}
_RENAMED = {"load_recipe": "load", "get_method": "get"}  # public name -> the owner's own name

if TYPE_CHECKING:  # what type checkers and IDEs see; at run time ``__getattr__`` imports on first use
    from .analysis.audit import AuditReport, PairwiseReport, audit_pairwise, audit_trajectories
    from .analysis.inspect import AdapterSummary, describe
    from .demo.run import run_demo
    from .demo.trajectories import make_trajectories
    from .errors import (
        AdapterError,
        AlignmentError,
        CheckFailed,
        EvidenceError,
        ExpressionError,
        LineageError,
        MergeArgumentError,
        ModelError,
        NumericError,
        OutputError,
        Problem,
        RecipeError,
        SVDInputError,
        UsageError,
        VecmergeError,
        WorkspaceError,
    )
    from .evidence.gate.gate import GateConfig, GateFacts, GateResult, evaluate_gate
    from .evidence.importers.importers import import_files
    from .evidence.judge.compare import compare_records
    from .evidence.ledger.ledger import Ledger
    from .evidence.stats.noise import pooled_noise
    from .evidence.stats.stats import runs_by_model, summarize_records
    from .expr import LinearForm, parse
    from .linalg.lowrank import LowRank, combine
    from .linalg.rank_policy import RankPolicy
    from .linalg.rankcut import cut
    from .methods.base import Field, Method
    from .methods.registry import get as get_method
    from .methods.registry import register
    from .models.extract_write import ExtractReport, extract
    from .models.fuse import FuseReport, fuse
    from .peft.adapter import Adapter
    from .peft.format import LoraConfig
    from .peft.write import write_adapter
    from .pipeline.evaluation import evaluate
    from .pipeline.runner import RunReport, run
    from .recipe.load import load as load_recipe
    from .recipe.recipe import Consensus, Recipe
    from .verify.checks.output import verify_output
    from .verify.report import VerifyReport
    from .workspace.names import Workspace
    from .workspace.taskvector import TaskVector, linear_combination


def __getattr__(name: str):
    if name in _API:
        import importlib

        module = importlib.import_module(f".{_API[name]}", __name__)
        value = getattr(module, _RENAMED.get(name, name))
        globals()[name] = value  # once imported, a plain attribute
        return value
    raise AttributeError(f"module 'vecmerge' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_API))


__all__ = [  # the public API (every name of _API), literal so that linters and type checkers read it
    "Adapter", "AdapterError", "AdapterSummary", "AlignmentError", "AuditReport", "CheckFailed", "Consensus",
    "EvidenceError", "ExpressionError", "ExtractReport", "Field", "FuseReport", "GateConfig", "GateFacts",
    "GateResult", "Ledger", "LineageError", "LinearForm", "LoraConfig", "LowRank", "MergeArgumentError", "Method",
    "ModelError", "NumericError", "OutputError", "PairwiseReport", "Problem", "RankPolicy", "Recipe", "RecipeError",
    "RunReport", "SVDInputError", "TaskVector", "UsageError", "VecmergeError", "VerifyReport", "Workspace",
    "WorkspaceError", "audit_pairwise", "audit_trajectories", "combine", "compare_records", "cut", "describe",
    "evaluate", "evaluate_gate", "extract", "fuse", "get_method", "import_files", "linear_combination",
    "load_recipe", "make_trajectories", "parse", "pooled_noise", "register", "run", "run_demo", "runs_by_model",
    "summarize_records", "verify_output", "write_adapter", "__version__",
]
