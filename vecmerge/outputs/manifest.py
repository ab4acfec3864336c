"""``vecmerge.json``, the manifest of every output folder (merge, extract, fuse): its one owner.

What every manifest holds, whatever wrote it::

    {"tool": "vecmerge", "created": <UTC ISO time>, "kind": <kind>,     stamp(kind)
     ... what the kind records (recipe, inputs, settings, figures, modules) ...,
     "vecmerge_version": <version>, "output": {<the written files and their sha256>}}   finish(...)

``kind`` is the recipe's kind for the pipeline's outputs (``project``, ``refactor``, ``merge``), else
``extract`` or ``fuse``. The file name, its size bound, the keys a pipeline manifest may hold (``verify``
refuses any other), the shape ``verify`` needs before reading one (``shape_problems``) and the tolerances
``verify`` judges an output by (``TOLERANCES``) live here; ``jsonable`` is the one conversion of results
to strict JSON data. The kind-specific parts are built by their writers (``pipeline.manifest``,
``models.extract_write``, ``models.fuse``); the model card beside it by ``outputs.card``.
"""

from __future__ import annotations

import datetime
import json
import math
import os
from pathlib import Path

from ..errors import OutputError
from ..io.hashing import sha256_file
from ..io.parse import ParseError, load_json, short
from ..version import __version__

MANIFEST_NAME = "vecmerge.json"
MANIFEST_MAX_BYTES = 64 << 20
TOOL = "vecmerge"

# The keys of a pipeline manifest (project, refactor, merge), each always written, and those written sometimes.
MANIFEST_KEYS = ("tool", "created", "kind", "method", "recipe", "resolved", "inputs", "missing_modules", "figures",
                 "modules", "vecmerge_version", "output")
# where the inputs' relative paths start; the gate's table when one ran; the file a recipe came from (merge --config);
# a protected step's figures
OPTIONAL_KEYS = ("workspace", "gate", "config", "protection")
CONFIG_KEYS = ("format", "path", "sha256", "merge_method", "base_model", "mergekit_defaults", "notes")
OUTPUT_KEYS = ("weights", "sha256", "config_sha256", "card_sha256", "dtype", "modules")

# What `vecmerge verify` accepts (see verify/output.py for why): the pipeline refuses to write an output that
# its own figures say would fail these.
TOLERANCES = {"fp32": {"update": 1e-5, "survival": 1e-4, "logits": 1e-4},
              "fp16": {"update": 5e-3, "survival": 2e-2, "logits": 2e-2},
              "bf16": {"update": 3e-2, "survival": 5e-2, "logits": 1e-1}}


def jsonable(x):
    """``x`` as strict JSON data: non-finite floats as null, typed results by ``to_dict()``, keys and other objects
    (Paths) as strings."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if isinstance(x, (str, int, bool)) or x is None:
        return x
    if callable(getattr(x, "to_dict", None)):  # a typed result (``results.Result``) or record
        return jsonable(x.to_dict())
    return str(x)


def portable(path: str | Path, home: Path) -> str:
    """``path`` relative to ``home`` (POSIX separators), with ``..`` when it lies outside it: an upload-ready
    folder holds no absolute local path (absolute only where no relative path exists, another drive)."""
    p = Path(path).resolve()
    try:
        return Path(os.path.relpath(p, Path(home).resolve())).as_posix()
    except ValueError:
        return str(p)


def stamp(kind: str) -> dict:
    """The fields every manifest opens with: ``{"tool": "vecmerge", "created": <now, UTC ISO>, "kind": kind}``."""
    return {"tool": TOOL, "created": datetime.datetime.now(datetime.timezone.utc).isoformat(), "kind": kind}


def adapter_files(folder, weights: str, config: str, weights_sha256: str | None = None) -> dict:
    """The part of ``output`` every adapter output records: ``{"weights": name, "sha256", "config_sha256"}``.

    Args:
        folder (str | Path): the staged output folder. weights, config (str): the file names in it.
        weights_sha256 (str | None): the weights' sha256 when the writer took it (else read from the file).
    """
    folder = Path(folder)
    sha = weights_sha256 if weights_sha256 is not None else sha256_file(folder / weights)
    return {"weights": weights, "sha256": sha, "config_sha256": sha256_file(folder / config)}


def finish(manifest: dict, output: dict) -> dict:
    """``manifest`` closed by ``vecmerge_version`` and ``output`` (what was written, and its hashes)."""
    return {**manifest, "vecmerge_version": __version__, "output": output}


def write_manifest(folder, manifest: dict) -> None:
    """Write ``folder/vecmerge.json``: ``jsonable(manifest)``, indented, strict (no NaN), one trailing newline."""
    (Path(folder) / MANIFEST_NAME).write_text(json.dumps(jsonable(manifest), indent=2, allow_nan=False) + "\n")


def written_by_vecmerge(data) -> bool:
    """Whether parsed manifest data says vecmerge wrote it (``"tool": "vecmerge"``)."""
    return isinstance(data, dict) and data.get("tool") == TOOL


def read_manifest(folder) -> dict:
    """The ``vecmerge.json`` of an output folder, read strictly (no NaN, bounded size and depth)."""
    p = Path(folder) / MANIFEST_NAME
    if not Path(folder).is_dir():
        raise OutputError(f"{folder}: no such folder; give the --out folder of a vecmerge command")
    if not p.is_file():
        raise OutputError(f"{folder}: no {MANIFEST_NAME}; was it written by vecmerge? "
                          "use 'vecmerge verify --identities' for other adapters")
    try:
        return load_json(p, max_bytes=MANIFEST_MAX_BYTES)
    except ParseError as e:
        raise OutputError(f"{e} (the manifest was edited or truncated)") from None


def shape_problems(manifest) -> list[str]:
    """Where a pipeline manifest does not have the shape vecmerge writes (sections, per-module entries, hashes).

    ``verify`` reads the manifest only once it has this shape, so an edit of a type is one clear line
    (exit 2) and an edit of a value is a failed check, never a crash.
    """
    if not isinstance(manifest, dict):
        return [f"is {short(manifest, 40)}, not a mapping"]
    out = []
    for key in ("recipe", "output", "resolved", "inputs", "missing_modules", "figures", "modules"):
        if key in manifest and not isinstance(manifest[key], dict):
            out.append(f"{key} is {short(manifest[key], 40)}, not a mapping")
    for key in ("recipe", "output"):
        if key not in manifest:
            out.append(f"{key} is missing")
    if not out and manifest["recipe"].get("inputs") is not None and not isinstance(manifest["recipe"]["inputs"], dict):
        out.append(f"recipe.inputs is {short(manifest['recipe']['inputs'], 40)}, not a mapping")
    if out:
        return out
    for section in ("modules", "inputs"):
        out += [f"{section}[{short(k, 60)}] is {short(v, 40)}, not a mapping"
                for k, v in manifest.get(section, {}).items() if not isinstance(v, dict)]
    pins = [*((f"inputs.{n}", e) for n, e in manifest.get("inputs", {}).items()),
            *((f"recipe.inputs.{n}", e) for n, e in (manifest["recipe"].get("inputs") or {}).items()
              if isinstance(e, dict))]
    out += [f"{where}.{k} is {short(e[k], 40)}, not a string" for where, e in pins if isinstance(e, dict)
            for k in ("sha256", "config_sha256") if e.get(k) is not None and not isinstance(e[k], str)]
    out += [f"output.{k} is {short(v, 40)}, not a string" for k, v in manifest["output"].items()
            if k in ("weights", "sha256", "config_sha256", "card_sha256", "dtype") and not isinstance(v, str)]
    res = manifest.get("resolved", {})
    out += [f"resolved.{k} is {short(res[k], 40)}, not a list"
            for k in ("dropped", "zeroed", "dropped_by_consensus", "zeroed_by_method")
            if k in res and not isinstance(res[k], list)]
    out += [f"resolved.{k} is {short(res[k], 40)}, not a mapping" for k in ("module_alpha", "realized")
            if k in res and not isinstance(res[k], dict)]
    return out
