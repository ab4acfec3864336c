"""vecmerge: surgery on LoRA adapters with exact factored algebra, audits and verified PEFT output.

The public API is imported lazily, so ``vecmerge --help`` does not pay for torch::

    from vecmerge import Workspace, RankPolicy, cut
    ws = Workspace()                                  # reads ./vecmerge.yaml if present
    step = ws.evaluate("v51 - v28")                   # TaskVector, exact, never dense
    c = cut(step["model.layers.0.mlp.up_proj"], RankPolicy.parse("8"))   # c.error is exact
"""

__version__ = "0.1.0"

_API = {
    "LowRank": "linalg.lowrank", "combine": "linalg.lowrank",
    "Adapter": "peft.adapter", "LoraConfig": "peft.format",
    "TaskVector": "workspace.taskvector", "linear_combination": "workspace.taskvector",
    "parse": "expr", "LinearForm": "expr",
    "Workspace": "workspace.names",
    "RankPolicy": "linalg.rank_policy", "cut": "linalg.rankcut",
    "Recipe": "recipe.recipe", "run": "pipeline", "evaluate": "pipeline",
    "write_adapter": "peft.write",
    "VecmergeError": "errors",
}


def __getattr__(name):
    if name in _API:
        import importlib

        return getattr(importlib.import_module(f".{_API[name]}", __name__), name)
    raise AttributeError(f"module 'vecmerge' has no attribute {name!r}")


__all__ = sorted(_API) + ["__version__"]
