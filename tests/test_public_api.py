"""The public API: every name in ``vecmerge.__all__`` resolves lazily, torch-free on import; examples use only it."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import vecmerge

ROOT = Path(__file__).resolve().parents[1]
PUBLIC_MODULES = {"vecmerge", "vecmerge.testing", "vecmerge.cli"}  # the API, the test helpers, the console script


def test_all_is_the_api_map_and_every_name_resolves_to_its_owner():
    assert vecmerge.__all__ == sorted(vecmerge._API) + ["__version__"]
    assert len(vecmerge._API) >= 60 and vecmerge._API["load_recipe"] == ("recipe.load", "load")
    for name, (module, own_name) in vecmerge._API.items():
        obj = getattr(vecmerge, name)
        owner = sys.modules[f"vecmerge.{module}"]
        assert obj is getattr(owner, own_name), name


def test_public_names_are_written_once():
    """Issue 32 item 5: each public name appears once in vecmerge/__init__.py's code (its TYPE_CHECKING import)."""
    import re
    from pathlib import Path

    source = Path(vecmerge.__file__).read_text()
    code = source.split('"""', 2)[2]  # past the module docstring
    imports = [line for line in code.splitlines() if line.lstrip().startswith("from .")]
    for name in vecmerge._API:
        assert f'"{name}"' not in code and f"'{name}'" not in code, name  # no second list of names
        assert sum(bool(re.search(rf" as {name}\b", line)) for line in imports) == 1, name
    for name in ("run", "load_recipe", "Recipe", "RunReport", "verify_output", "extract", "fuse", "Ledger",
                 "evaluate_gate", "Method", "Field", "register", "RankPolicy", "LowRank", "TaskVector", "Workspace",
                 "Adapter", "VecmergeError", "RecipeError", "CheckFailed"):
        assert name in vecmerge.__all__, name


def test_import_vecmerge_is_torch_free_until_a_name_is_used():
    code = ("import sys, vecmerge; a = 'torch' in sys.modules; vecmerge.Recipe; b = 'torch' in sys.modules; "
            "vecmerge.LowRank; print(a, b, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "False", "True"]  # the recipe layer is torch-free too


def test_examples_import_only_the_public_api():
    for path in sorted((ROOT / "examples").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("vecmerge"):
                assert node.module in PUBLIC_MODULES, f"{path.name} imports {node.module}"
                if node.module == "vecmerge":
                    assert all(a.name in vecmerge.__all__ for a in node.names), path.name
            elif isinstance(node, ast.Import):
                assert all(a.name in PUBLIC_MODULES or not a.name.startswith("vecmerge") for a in node.names)


# What a benchmark may import beyond the public API: the internal building blocks it measures on their own
# (or builds its inputs with). Each such import sits under one comment line saying so; anything else a
# benchmark needs belongs in ``vecmerge.__all__``.
BUILDING_BLOCKS = {
    "vecmerge.pipeline.build": {"build_output"},  # the merge-and-cut stage, timed apart from evaluate
    "vecmerge.linalg.merge_kernels": {"ties", "dare_ties", "magnitude_prune", "module_seed"},  # vs PEFT's kernels
    "vecmerge.linalg.randsvd": {"truncated_svd"},  # the randomized SVD, timed on its own
    "vecmerge.io.model_folder": {"ModelFolder"},  # reading the extract benchmark's models
    "vecmerge.io.safetensors_write": {"SafetensorsWriter", "write_index"},  # writing them
    "vecmerge.probe.runner": {"ProbeModel", "run_probe", "_batch_tensors", "load_base"},  # the runner, its batching
    "vecmerge.probe.prompts": {"read_prompts", "Item", "PromptSet"},  # the runner's input; the capture bench's
    "vecmerge.probe.hooks": {"Update", "LoraHooks"},  # the backbone's hooks a protected step's capture runs under
    "vecmerge.probe.capture": {"capture_grams"},  # the protected step's capture, timed apart
    "vecmerge.report.protect": {"frontier_png"},  # the protected-step frontier plot
    "vecmerge.linalg.lowrank": {"resolve_device"},  # the --device rule
    "vecmerge.commands.judging": {"compare_models"},  # the ledger's reads, in-process
    "vecmerge.commands.recording": {"export_lines"},
    "vecmerge.commands.summaries": {"show"},
    "vecmerge.evidence.ledger.schema": {"RECORD_COLUMNS"},  # the columns of the plain sqlite3 scan
    "vecmerge.search": {"engine"},  # the search's setup, timed apart from its candidates
    "vecmerge.search.candidate": {"build", "dense"},  # a candidate's hooks; its dense update for the evolve way
    "vecmerge.search.optimize": {"grid"},  # the candidates both ways score
    "vecmerge.search.space": {"candidate"},  # ... and their recipes
    "vecmerge.search.evaluate": {"Scorer"},  # the same scoring for both ways
    "vecmerge.probe.quiet": {"quiet_libraries"},  # transformers' loading bars off in the evolve loop
}


def test_benchmarks_import_the_public_api_or_a_named_building_block():
    used = set()
    for path in sorted((ROOT / "benchmarks").rglob("*.py")):
        lines = path.read_text().splitlines()
        for node in ast.walk(ast.parse("\n".join(lines))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("vecmerge"):
                names = {a.name for a in node.names}
                if node.module == "vecmerge":
                    assert names <= set(vecmerge.__all__), f"{path.name}: {names - set(vecmerge.__all__)}"
                elif node.module not in PUBLIC_MODULES:
                    allowed = BUILDING_BLOCKS.get(node.module, set())
                    assert names <= allowed, f"{path.name} imports {node.module}: {names - allowed}"
                    above = node.lineno - 2  # one comment line over the building-block imports it heads
                    while lines[above].strip().startswith("from vecmerge."):
                        above -= 1
                    assert lines[above].strip().startswith("#"), f"{path.name}:{node.lineno}: say why"
                    used |= {(node.module, n) for n in names}
            elif isinstance(node, ast.Import):
                assert all(a.name in PUBLIC_MODULES or not a.name.startswith("vecmerge") for a in node.names)
    assert used == {(m, n) for m, ns in BUILDING_BLOCKS.items() for n in ns}  # no stale entry
