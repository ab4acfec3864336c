"""Reading a recipe from a file: a YAML recipe, or the ``recipe`` of an output's ``vecmerge.json`` manifest.

Both are read strictly and bounded (``io.parse``); a manifest's input paths start from its ``workspace``
(``manifest_root``). This module imports no torch.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import RecipeError
from ..io.files import check_regular
from ..io.parse import ParseError, load_json, load_yaml
from ..outputs.manifest import MANIFEST_MAX_BYTES
from .recipe import Recipe


def load(path: str | Path) -> Recipe:
    """Read a YAML recipe, or the ``recipe`` of a ``vecmerge.json`` manifest (JSON).

    Both are read strictly and bounded (``safe_parse``: no YAML anchors or aliases, no NaN, limited
    size and depth), so a hostile file is one RecipeError line, never a blow-up.
    """
    path = Path(path)
    if path.is_dir() and (path / "vecmerge.json").exists():
        path = path / "vecmerge.json"
    check_regular(path)
    if not path.is_file():
        raise RecipeError([f"no such file: {path}"], str(path))
    try:
        data = load_json(path, max_bytes=MANIFEST_MAX_BYTES) if path.suffix == ".json" else load_yaml(path)
    except ParseError as e:
        raise RecipeError([e.problem], e.source if e.line is None else f"{e.source}:{e.line}") from None
    root = path.parent
    if isinstance(data, dict) and "recipe" in data and "output" in data:
        root = manifest_root(path.parent, data)
        data = data["recipe"]  # a manifest: re-run its recipe
    return Recipe.from_dict(data, str(path), root=root)


def manifest_root(folder: str | Path, manifest: dict) -> Path:
    """The folder a manifest's input paths start from: ``folder / manifest["workspace"]``.

    ``workspace`` is the workspace folder relative to the output folder (or absolute); a manifest
    without it has absolute input paths, and its own folder is returned.

    Args:
        folder (str | Path): the output folder holding ``vecmerge.json``. manifest (dict): its content.
    """
    ws = manifest.get("workspace") if isinstance(manifest, dict) else None
    return (Path(folder) / ws).resolve() if isinstance(ws, str) else Path(folder).resolve()


def with_absolute_inputs(manifest: dict, folder: str | Path) -> dict:
    """A copy of ``manifest`` whose input paths (``inputs``, ``recipe.inputs``, ``recipe.protect`` and
    ``recipe.target``) and DoRA base folder (``recipe.base_model``) are absolute.

    Args:
        manifest (dict): a ``vecmerge.json``. folder (str | Path): the output folder it was read from.
    """
    root = manifest_root(folder, manifest)

    def fix(entries: object) -> object:
        if not isinstance(entries, dict):
            return entries
        return {n: {**e, "path": str(root / e["path"])} if isinstance(e, dict) and isinstance(e.get("path"), str)
                else e for n, e in entries.items()}

    out = dict(manifest)  # a section the manifest lacks stays absent (verify names it as missing)
    if "inputs" in manifest:
        out["inputs"] = fix(manifest["inputs"])
    if isinstance(manifest.get("recipe"), dict) and "inputs" in manifest["recipe"]:
        out["recipe"] = dict(manifest["recipe"], inputs=fix(manifest["recipe"]["inputs"]))
    base = out["recipe"].get("base_model") if isinstance(out.get("recipe"), dict) else None
    if isinstance(base, str) and not Path(base).is_absolute():  # a DoRA base folder, relative to the workspace
        out["recipe"] = dict(out["recipe"], base_model=str(root / base))
    r = out.get("recipe")
    if isinstance(r, dict):  # a protected step's prompt files, like the inputs
        for key in ("protect", "target"):
            if isinstance(r.get(key), dict):
                r = dict(r, **{key: {n: str(root / f) if isinstance(f, str) else f for n, f in r[key].items()}})
        out["recipe"] = r
    return out
