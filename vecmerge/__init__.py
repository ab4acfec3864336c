"""vecmerge: surgery on LoRA adapters with exact factored algebra, audits and verified PEFT output.

The public API is imported lazily, so ``vecmerge --help`` does not pay for torch::

    from vecmerge import Workspace, RankPolicy, cut
    ws = Workspace()                                  # reads ./vecmerge.yaml if present
    step = ws.evaluate("v51 - v28")                   # TaskVector, exact, never dense
    c = cut(step["model.layers.0.mlp.up_proj"], RankPolicy.parse("8"))   # c.error is exact
"""

__version__ = "0.1.0"

_API = {
    "LowRank": "lowrank", "combine": "lowrank",
    "Adapter": "adapter", "LoraConfig": "peft_format",
    "TaskVector": "taskvector", "linear_combination": "taskvector",
    "parse": "expr", "LinearForm": "expr",
    "Workspace": "workspace",
    "RankPolicy": "options", "cut": "rankcut",
    "Recipe": "recipe", "run": "pipeline", "evaluate": "pipeline",
    "write_adapter": "export",
    "VecmergeError": "errors",
}


def __getattr__(name):
    if name in _API:
        import importlib

        return getattr(importlib.import_module(f".{_API[name]}", __name__), name)
    raise AttributeError(f"module 'vecmerge' has no attribute {name!r}")


__all__ = sorted(_API) + ["__version__"]
