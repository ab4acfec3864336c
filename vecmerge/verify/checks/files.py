"""Every file of an output folder and every field of its manifest, accounted for (``vecmerge verify``).

- ``files``: the folder holds exactly what vecmerge writes (``OUTPUT_FILES``: adapter_config.json,
  adapter_model.safetensors, vecmerge.json, README.md), each a regular file; the model card's sha256 is
  the one the manifest pins. Anything else fails by name: a later tool or person may load what sits
  beside the weights (``adapter_model.bin``, ``evil.py``).
- ``figures``: every number of the manifest's ``figures`` and ``modules`` recomputed from the written
  weights and the re-evaluated recipe (``output.rebuilt_figures``): ranks, exact ranks, relative errors,
  survival, residual, dtype effect. Within ``FIGURES_RTOL`` relative (``checks.close``; nothing passes
  on NaN); ranks exactly.
- ``manifest``: every other field: ``tool``, ``kind``, ``method``, ``resolved`` (alpha, realized step,
  dropped and zeroed modules), ``missing_modules``, the copy of the inputs' sha256 that the model card
  shows, ``output`` (file name, the dtype the tensors are really stored in, module count, the form of
  the hashes, whose values ``output sha256`` and ``files`` compare). A key vecmerge does not write fails.

Each check's detail names the field that differs and both values (``figures.dtype_effect is 0.0,
recomputes to 3.57e-08``).
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

from ...errors import few
from ...io.hashing import sha256_file
from ...io.parse import short
from ...outputs.card import CARD_NAME
from ...outputs.manifest import CONFIG_KEYS, MANIFEST_KEYS, MANIFEST_NAME, OPTIONAL_KEYS, OUTPUT_KEYS, jsonable
from ...peft.adapter import Adapter
from ...peft.format import SAFETENSORS_NAME
from ...peft.write import OUTPUT_FILES
from ..report import check, close

FIGURES_RTOL = 1e-6  # recorded figures reproduce: same formulas on the same stored weights
RESOLVED_RTOL = 1e-9  # alpha and the realized step are ratios of float64 norms: they reproduce to round-off
_HEX64 = re.compile(r"[0-9a-f]{64}")
SHOWN = 4  # differences named in a detail line


def files_check(path: Path, manifest: dict, expected=OUTPUT_FILES, pin_required: bool = True) -> dict:
    """The folder holds exactly ``expected``, as regular files, and README.md hashes as pinned.

    Anything else, dotfiles and folders included, fails by name.

    Args:
        path (Path): the output folder. manifest (dict): its vecmerge.json.
        expected (Iterable[str]): every entry the folder should hold (default: an adapter output's ``OUTPUT_FILES``;
            ``verify.checks.models`` gives a fuse's or an extract's list).
        pin_required (bool): a manifest without ``output.card_sha256`` fails (pipeline outputs always pin the
            card); False: the card is checked only when pinned (extract and fuse manifests of vecmerge <= 0.1.0).
    """
    expected = tuple(dict.fromkeys(expected))
    try:
        entries = sorted(os.listdir(path))
    except OSError as e:
        return check("files", False, f"{path}: cannot list it ({e.strerror or e})")
    extra = [n for n in entries if n not in expected]
    missing = [n for n in expected if n not in entries]
    odd = [n for n in entries if n in expected and not stat.S_ISREG(os.lstat(path / n).st_mode)]
    problems = []
    if extra:
        problems.append(f"{few(extra)} in {path} {'is' if len(extra) == 1 else 'are'} not written by vecmerge "
                        "(a tool loading this folder may use it); remove it, or verify a fresh output")
    if missing:
        problems.append(f"{few(missing)} missing")
    if odd:
        problems.append(f"{few(odd)} not a regular file (a link?)")
    pin = (manifest.get("output") or {}).get("card_sha256")
    card = path / CARD_NAME
    got = sha256_file(card) if CARD_NAME in entries and CARD_NAME not in odd else None
    if got is not None and got != pin and (pin_required or pin is not None):
        problems.append(f"{card} has sha256 {got[:16]}..., the manifest pins {short(pin, 20)}: the model card "
                        "was edited after writing")
    pinned = "as pinned" if pin is not None else "not pinned (a manifest of vecmerge <= 0.1.0)"
    return check("files", not problems, "; ".join(problems) or
                 f"exactly {few(list(expected), 8)}; {CARD_NAME} {pinned}",
                 {"extra": extra, "missing": missing, "card_sha256": got})


def figures_check(manifest: dict, expected: dict) -> dict:
    """``figures`` and ``modules`` of the manifest equal the recomputed ones (``expected``: both keys).

    Args:
        manifest (dict): vecmerge.json. expected (dict): ``{"figures": {...}, "modules": {m: {...}}}``
            rebuilt from the re-evaluated recipe (``verify.rebuilt_figures``: the pipeline's own cut,
            rounding and figures, so every key is accounted for; the written weights are checked
            against the recomputed update by ``update`` and ``step``).
    """
    off = []
    for key in ("figures", "modules"):
        off += differences(jsonable(expected[key]), manifest.get(key), key)
    return check("figures", not off, "; ".join(off[:SHOWN]) + (f" and {len(off) - SHOWN} more" if len(off) > SHOWN
                                                               else "") if off else
                 f"every figure of figures and modules ({len(expected['modules'])}) recomputes from the recipe "
                 f"(rtol {FIGURES_RTOL:g})", {"differing": off[:20]})


def manifest_check(manifest: dict, ev, out: Adapter | None, resolved: dict) -> dict:
    """Every field of the manifest besides the recipe and the figures, against the re-evaluation and the files.

    Args:
        manifest (dict): vecmerge.json. ev (Evaluation): its recipe re-evaluated. out (Adapter | None): the
            opened output (None if it cannot be opened). resolved (dict): ``pipeline.manifest.resolved_for``.
    """
    recipe = ev.recipe
    off = [f"{k} is not a field vecmerge writes" for k in manifest if k not in MANIFEST_KEYS + OPTIONAL_KEYS]
    off += [f"{k} is missing" for k in MANIFEST_KEYS if k not in manifest]
    for key, want in (("tool", "vecmerge"), ("kind", recipe.kind), ("method", ev.method.name)):
        off += differences(want, manifest.get(key, want), key)
    off += [f"{k} is {short(manifest[k], 40)}, not a string" for k in ("created", "vecmerge_version")
            if k in manifest and not isinstance(manifest[k], str)]
    off += differences(jsonable(resolved), manifest.get("resolved", {}), "resolved", RESOLVED_RTOL)
    off += differences(jsonable(ev.missing), manifest.get("missing_modules", {}), "missing_modules")
    copy = manifest.get("inputs", {})
    want = {n: {"sha256": i.sha256, "config_sha256": i.config_sha256} for n, i in ev.inputs.items()}
    if sorted(copy) != sorted(want):
        off.append(f"inputs names {few(sorted(copy))}, the recipe reads {few(sorted(want))}")
    else:
        for n, pins in want.items():
            off += [f"inputs.{n}.{k} is {short(copy[n].get(k), 20)}, the input's file hashes to {v[:16]}..."
                    for k, v in pins.items() if copy[n].get(k) != v]
            pinned = (manifest["recipe"].get("inputs") or {}).get(n)
            off += differences(pinned, copy[n], f"inputs.{n}") if pinned != copy[n] else []
    off += _output_fields(manifest.get("output"), recipe.dtype, out)
    if "config" in manifest:
        off += _config_fields(manifest["config"])
    return check("manifest", not off, "; ".join(off[:SHOWN]) + (f" and {len(off) - SHOWN} more" if len(off) > SHOWN
                                                                else "") if off else
                 f"every field of {MANIFEST_NAME} (resolved, missing_modules, inputs, output) recomputes",
                 {"differing": off[:20]})


def _config_fields(config) -> list[str]:
    """Problems with the record of the configuration file a recipe was translated from (``merge --config``)."""
    if not isinstance(config, dict):
        return [f"config is {short(config, 40)}, not a mapping"]
    off = [f"config.{k} is not a field vecmerge writes" for k in config if k not in CONFIG_KEYS]
    off += [f"config.{k} is missing" for k in ("format", "path", "sha256") if k not in config]
    if "sha256" in config and not (isinstance(config["sha256"], str) and _HEX64.fullmatch(config["sha256"])):
        off.append(f"config.sha256 is {short(config['sha256'], 20)}, not a sha256")
    return off


def _output_fields(output, dtype: str, out: Adapter | None) -> list[str]:
    if not isinstance(output, dict):
        return [f"output is {short(output, 40)}, not a mapping"]
    off = [f"output.{k} is not a field vecmerge writes" for k in output if k not in OUTPUT_KEYS]
    off += [f"output.{k} is missing" for k in OUTPUT_KEYS if k not in output]
    off += differences(SAFETENSORS_NAME, output.get("weights", SAFETENSORS_NAME), "output.weights")
    off += differences(dtype, output.get("dtype", dtype), "output.dtype")
    off += [f"output.{k} is {short(output[k], 20)}, not a sha256" for k in ("sha256", "config_sha256", "card_sha256")
            if k in output and not (isinstance(output[k], str) and _HEX64.fullmatch(output[k]))]
    if out is not None:
        off += differences(len(out.modules), output.get("modules", len(out.modules)), "output.modules")
        stored = sorted({s.dtype for s in out.specs.values()})
        if stored != [dtype]:
            off.append(f"the weights are stored as {', '.join(stored)}, the recipe asks {dtype}")
    return off


def differences(expected, got, where: str, rtol: float = FIGURES_RTOL) -> list[str]:
    """Every place where ``got`` (recorded) differs from ``expected`` (recomputed), one line each.

    Mappings must have the same keys, lists the same length; numbers agree within ``rtol`` (integers
    exactly, and NaN never); strings, booleans and null exactly.
    """
    if isinstance(expected, dict):
        if not isinstance(got, dict):
            return [f"{where} is {short(got, 40)}, recomputes to a mapping"]
        out = [f"{_at(where, k)} is missing" for k in expected if k not in got]
        out += [f"{_at(where, k)} is not a field vecmerge writes" for k in got if k not in expected]
        for k in expected:
            if k in got:
                out += differences(expected[k], got[k], _at(where, k), rtol)
        return out
    if isinstance(expected, list):
        if not isinstance(got, list) or len(got) != len(expected):
            return [f"{where} is {short(got, 60)}, recomputes to {short(expected, 60)}"]
        return [d for i, (e, g) in enumerate(zip(expected, got)) for d in differences(e, g, f"{where}[{i}]", rtol)]
    numbers = (int, float)
    if isinstance(expected, numbers) and not isinstance(expected, bool):
        if isinstance(got, numbers) and not isinstance(got, bool):
            same = got == expected if isinstance(expected, int) and isinstance(got, int) else close(
                float(got), float(expected), rtol)
            if same:
                return []
        return [f"{where} is {short(got, 40)}, recomputes to {expected!r}"]
    if got == expected and type(got) is type(expected):
        return []
    return [f"{where} is {short(got, 40)}, recomputes to {short(expected, 40)}"]


def _at(where: str, key) -> str:
    return f"{where}.{key}" if re.fullmatch(r"\w+", str(key)) else f"{where}[{key}]"
