"""The inputs a recipe names and the folders it will write: opened once, pinned, never written.

Every name in the recipe's expressions resolves through the workspace (``inputs:`` entries of the
recipe take precedence) and is opened by ``workspace.inputs.open_inputs`` (inputs whose declared base
models differ are refused unless the recipe has ``allow_base_mismatch``); each adapter's weights are read
once into memory and hashed in the same pass, with its config, and a pinned sha256 that no longer matches
is an error naming the input (``RecipeError``, exit 2), all before any tensor is read. ``output_policy``
protects the inputs (and every workspace adapter and the base model) from being written.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import Problem, RecipeError
from ..outputs.policy import OutputPolicy
from ..peft.format import CONFIG_NAME
from ..recipe.recipe import Recipe
from ..workspace.inputs import Inputs
from ..workspace.inputs import open_inputs as open_named
from ..workspace.names import Workspace


@dataclass(frozen=True)
class InputRecord:
    """One input adapter as the manifest records it.

    Args:
        path (str): its folder. sha256 (str): of the weights file. config_sha256 (str): of adapter_config.json.
        base_model (str | None): the base model its config declares (``base_model_name_or_path``).
    """

    path: str
    sha256: str
    config_sha256: str
    base_model: str | None = None

    def to_dict(self) -> dict:
        return {"path": self.path, "sha256": self.sha256, "config_sha256": self.config_sha256,
                "base_model": self.base_model}


def open_inputs(recipe: Recipe, ws: Workspace, names: list[str]
                ) -> tuple[Workspace, dict[str, InputRecord], Inputs]:
    """Open every adapter in ``names`` (recipe pins first); check sha256 pins; return (workspace, records, inputs).

    Args:
        recipe (Recipe): for its ``inputs`` (paths and pins) and ``modules_to_save`` policy.
        ws (Workspace): resolves the other names. names (list[str]): adapter names, in first-use order.

    Returns:
        (the workspace the pipeline reads through, {name: InputRecord}, the opened ``Inputs``); RecipeError on
        a changed pin, AlignmentError when the inputs declare different base models (unless allowed).
    """
    ws = ws.with_inputs({n: e["path"] for n, e in recipe.inputs.items()}).with_biases()  # pipeline.bias merges them
    if recipe.base_model is not None:
        ws = ws.with_dora_base(recipe.base_model)
    records: dict[str, InputRecord] = {}

    def pinned(adapters: dict) -> None:
        problems = []
        for name, a in adapters.items():
            a.load()  # read once, hashed in the same pass: the sha256 below is that of the bytes merged
            pins = recipe.inputs.get(name, {})
            for key, path, actual in (("sha256", a.weights_path, a.sha256),
                                      ("config_sha256", a.path / CONFIG_NAME, a.config_sha256)):
                if pins.get(key) and pins[key] != actual:
                    problems.append(f"inputs.{name}: {path} has sha256 {actual[:12]}..., the recipe pins "
                                    f"{pins[key][:12]}...; the adapter changed since the recipe was written")
            records[name] = InputRecord(str(a.path), a.sha256, a.config_sha256, a.config.base_model)
        if problems:
            raise RecipeError(problems, "inputs")

    opened = open_named(ws, names, modules_to_save=recipe.modules_to_save,
                        allow_base_mismatch=recipe.allow_base_mismatch, before_reading=pinned)
    return ws, records, opened


def output_plan(recipe: Recipe) -> list[tuple[float, str | None]]:
    """(multiple, folder) of every output; a dose ladder writes ``OUT-x<k>`` per multiple.

    Args:
        recipe (Recipe): its ``dose``, ``multiple`` and ``out``.
    """
    if not recipe.dose:
        return [(recipe.multiple, recipe.out)]
    plan = [(k * recipe.multiple, None if recipe.out is None else f"{recipe.out}-x{k:g}") for k in recipe.dose]
    paths = [p for _, p in plan if p is not None]
    if len(set(paths)) != len(paths):
        raise RecipeError([Problem("{dose=}{}: two multiples write the same folder ({}); list each multiple once",
                                   recipe.dose, sorted(p for p in paths if paths.count(p) > 1)[0])])
    return plan


def output_policy(recipe: Recipe, ws: Workspace, names: list[str], force: bool) -> OutputPolicy:
    """What this recipe may write (``outputs.policy.OutputPolicy``): never an input, a workspace adapter or the
    base model; with ``force`` only over a folder vecmerge wrote.

    Args:
        recipe (Recipe): its ``inputs`` (paths). ws (Workspace): adapters and base model.
        names (list[str]): the adapter names the recipe reads. force (bool): ``--force``.
    """
    ws = ws.with_inputs({n: e["path"] for n, e in recipe.inputs.items()})
    base = recipe.base_model if recipe.base_model is not None else ws.base_model
    return OutputPolicy.for_command(inputs={n: ws.path_of(n) for n in names}, workspace_adapters=ws.adapters,
                                    base_model=base, force=force)
