"""Writing ``vecmerge extract``'s PEFT folder: factors, saved modules, config, manifest and model card.

The folder is built by ``outputs.transaction.OutputTransaction`` (staged beside the target, fsynced, moved in
atomically; an existing ``--out`` is replaced only with ``--force`` and only if vecmerge wrote it).
Each module's factors are rounded to ``dtype`` by ``peft.write.prepare_modules`` as soon as the module is cut
and appended to a scratch file in the staging folder, so memory never holds more than one module; the
safetensors file is then streamed from the scratch file and, for ``modules_to_save``, from the fine-tune.

``vecmerge.json`` (``kind: extract``) records both models' file hashes, the settings, every module's
rank, method, total and dropped energy, kept share and relative error, every other differing tensor and
what was done with it (the common part through ``outputs.manifest``); ``vecmerge verify`` re-derives the
output from it (``verify.checks.models``). Local paths stay portable, as a merge's: ``workspace`` is the
workspace folder relative to the output, both models' paths are relative to it; with ``base_model_id`` the
config and the card name the base by that hub id (else the config keeps the local base folder).
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from ..io.hashing import sha256_file
from ..io.model_folder import ModelFolder
from ..io.safetensors_read import DTYPE_CODES
from ..io.safetensors_write import SafetensorsWriter, tensor_bytes
from ..outputs.card import CARD_NAME, model_card
from ..outputs.manifest import MANIFEST_NAME, adapter_files, finish, portable, stamp, write_manifest
from ..outputs.transaction import OutputPolicy, OutputTransaction
from ..peft.format import CONFIG_NAME, DTYPES, PREFIX, SAFETENSORS_NAME
from ..peft.spec import ModuleSpec
from ..peft.write import build_config, prepare_modules
from ..results import Result
from .extract import Extraction, cut_all, open_extraction
from .parts import ALL_LINEAR

SCRATCH = ".factors.scratch"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "vocab.json", "vocab.txt", "merges.txt", "tokenizer.model", "spiece.model", "chat_template.jinja",
                   "chat_template.json")


@dataclass(frozen=True, eq=False)
class ExtractReport(Result):
    """``vecmerge extract``'s result (``--json``: ``to_dict()``): the manifest it wrote (``vecmerge.json``), ``out``.

    Args:
        tool, created, kind (str): ``stamp("extract")``. workspace (str): the workspace folder relative to
            ``out``. inputs (dict): both models' paths (relative to the workspace) and file hashes.
        settings (dict): rank, targets, others, dtype, seed. figures (dict): modules, ranks, kept share,
            errors, seconds. modules (dict): per module rank, method, energies, errors, alpha, written rank.
        others (dict): the differing tensors outside the targets and what was done with them.
        vecmerge_version (str). output (dict): what was written and its hashes. out (str): the folder.
    """

    tool: str
    created: str
    kind: str
    workspace: str
    inputs: dict
    settings: dict
    figures: dict
    modules: dict
    others: dict
    vecmerge_version: str
    output: dict
    out: str


class _Factors:
    """Each module's rounded factors appended to a scratch file; what the final file needs is remembered."""

    def __init__(self, path: Path, dtype: str):
        self.path, self.dtype = path, dtype
        self.entries: list = []
        self.specs: dict = {}
        self.written: dict = {}
        self._f = open(path, "xb")
        self._off = 0

    def __call__(self, name: str, part, c) -> None:
        spec = ModuleSpec(name=name, kind=part.peft_kind, shape=tuple(part.shape), rank=max(c.rank, 1), scale=1.0,
                          transposed=part.transposed, dtype=self.dtype, keys=("", ""))
        tensors, written = prepare_modules({name: c.svd.lowrank()}, {name: spec}, self.dtype)
        for key, t in tensors.items():
            data = tensor_bytes(t)
            self._f.write(data)
            n = memoryview(data).nbytes
            self.entries.append((key, DTYPE_CODES[t.dtype], tuple(t.shape), self._off, n))
            self._off += n
        self.specs[name] = spec
        self.written[name] = (written[name].rank, written[name].alpha)

    def close(self) -> None:
        self._f.close()


def _write_weights(tmp: Path, ex: Extraction, fac: _Factors) -> None:
    saved = [(PREFIX + n, ex.tuned.info(src)) for n, src in ex.saved_tensors.items()]
    entries = [(k, code, shape) for k, code, shape, _, _ in fac.entries] + [(k, t.dtype, t.shape) for k, t in saved]
    w = SafetensorsWriter(tmp / SAFETENSORS_NAME, entries, {"format": "pt"})
    try:
        with open(fac.path, "rb") as f:
            for key, _, _, off, n in fac.entries:
                f.seek(off)
                w.write(key, f.read(n))
        for key, t in saved:
            w.write(key, ex.tuned.files[t.file].read_chunks(t, feed_hash=False))
        w.close()
    except BaseException:
        w.abort()
        raise
    fac.path.unlink()


def _config(ex: Extraction, fac: _Factors, base_model_id: str | None) -> dict:
    ranks = {m: r for m, (r, _) in fac.written.items()}
    alphas = {m: a for m, (_, a) in fac.written.items()}
    cfg = build_config(None, fac.specs, ranks, alphas, same_modules=False)
    cfg["base_model_name_or_path"] = base_model_id or str(ex.base.path.resolve())
    cfg["modules_to_save"] = list(ex.saved_modules) or None
    return cfg


def manifest_for(ex: Extraction, fac: _Factors, settings: dict, seconds: float, out: Path, home: Path) -> dict:
    """The ``vecmerge.json`` of an extraction (``outputs.manifest.finish`` closes it once the files exist); the
    models' paths relative to ``home``, ``workspace`` that folder relative to ``out`` (the output folder)."""
    mods = {m: {**rec, "alpha": fac.written[m][1], "written_rank": fac.written[m][0]} for m, rec in ex.modules.items()}
    return {**stamp("extract"), "workspace": portable(home, out),
            "inputs": {"base": {"path": portable(ex.base.path, home), "files": ex.base.sha256s()},
                       "tuned": {"path": portable(ex.tuned.path, home), "files": ex.tuned.sha256s()}},
            "settings": settings, "figures": {**ex.figures(), "seconds": seconds}, "modules": mods,
            "others": {"policy": ex.others_policy, "tensors": [o.to_dict() for o in ex.others],
                       "saved_modules": ex.saved_modules, "saved_tensors": ex.saved_tensors}}


def card_body(manifest: dict) -> str:
    fig, s, oth = manifest["figures"], manifest["settings"], manifest["others"]
    lines = [f"LoRA extracted by [vecmerge](https://pypi.org/project/vecmerge/) from the full fine-tune "
             f"`{manifest['inputs']['tuned']['path']}` of `{manifest['inputs']['base']['path']}`.", "",
             f"- rank = {s['rank']}, targets = {', '.join(s['targets'])}: {fig['modules']} modules, ranks "
             f"{fig['rank']['min']}..{fig['rank']['max']}",
             f"- kept share of the update's squared norm = {fig['kept_share']:.6f} (relative error "
             f"{fig['rel_error']:.3e}; worst module {fig['worst_module']}: {fig['max_rel_error']:.3e})",
             f"- other differing tensors: {len(oth['tensors'])}, "
             + (f"saved whole as modules_to_save ({len(oth['saved_modules'])} modules)" if oth["policy"] == "save"
                else "dropped (listed in vecmerge.json)" if oth["tensors"] else "none")]
    resized = [t for t in oth["tensors"] if t["kind"] == "resized"]
    if resized and oth["policy"] == "save":
        lines.append(f"- the vocabulary was resized ({resized[0]['base_shape']} -> {resized[0]['tuned_shape']}): "
                     "call `model.resize_token_embeddings(...)` on the base before loading; the tokenizer is here")
    lines += ["", "Inputs (sha256):", ""]
    for side in ("base", "tuned"):
        lines += [f"- {side} {n}: `{h}`" for n, h in manifest["inputs"][side]["files"].items()]
    lines += ["", "`vecmerge.json` holds every module's rank and exact error; `vecmerge verify <this folder>` "
              "re-derives them from both models."]
    return "\n".join(lines)


def extract(base_model, tuned, out, *, rank: str, targets=(ALL_LINEAR,), others: str | None = None,
            dtype: str = "fp32", seed: int = 0, force: bool = False, progress=None, home=None,
            base_model_id: str | None = None) -> ExtractReport:
    """Extract a LoRA from a full fine-tune and write it to ``out`` (see ``extract`` and this module).

    Args:
        base_model, tuned (str | Path): model folders. out (str | Path): the adapter folder to write.
        rank (str): N | energy:E | auto. targets (Iterable[str]). others (str | None): save | drop.
        dtype (str): fp32 | bf16 | fp16 of the factors. seed (int). force (bool): replace a vecmerge --out.
        progress (callable | None): wraps an iterable (tqdm). home (str | Path | None): the workspace folder the
            manifest's paths start from (default: the current folder). base_model_id (str | None): the base's hub
            id (ORG/NAME), written as the config's base model and in the card.

    Returns:
        ExtractReport: the manifest with ``out``.
    """
    if dtype not in DTYPES:
        raise ValueError(dtype)
    t0 = time.perf_counter()
    policy = OutputPolicy.for_command(inputs=[base_model, tuned], force=force)
    policy.check_folder(out)
    ex = open_extraction(base_model, tuned, rank=rank, targets=targets, others=others, seed=seed)
    try:
        with OutputTransaction(policy) as txn:
            tmp = txn.folder(out)
            fac = _Factors(tmp / SCRATCH, dtype)
            try:
                cut_all(ex, fac, progress)
            finally:
                fac.close()
            _write_weights(tmp, ex, fac)
            cfg = _config(ex, fac, base_model_id)
            (tmp / CONFIG_NAME).write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
            settings = {"rank": str(ex.policy), "targets": list(targets), "others": others, "dtype": dtype,
                        "seed": seed, "base_model_id": base_model_id}
            man = manifest_for(ex, fac, settings, time.perf_counter() - t0, Path(out).resolve(),
                               Path(home or Path.cwd()).resolve())
            if ex.resized and ex.others_policy == "save":
                for name in ex.tuned.other_files():
                    if name in TOKENIZER_FILES:
                        shutil.copyfile(ex.tuned.path / name, tmp / name)
            files = sorted(p.name for p in tmp.iterdir()) + [MANIFEST_NAME, CARD_NAME]
            # a local path is not a hub id: without base_model_id the card's front matter names no base model
            # (as project's); the body names both folders (relative to the workspace)
            (tmp / CARD_NAME).write_text(model_card(base_model_id, f"LoRA extracted from {ex.tuned.path.name}",
                                                    card_body(man)))
            man = finish(man, {**adapter_files(tmp, SAFETENSORS_NAME, CONFIG_NAME), "dtype": dtype,
                               "modules": len(fac.written), "files": files,
                               "card_sha256": sha256_file(tmp / CARD_NAME)})
            write_manifest(tmp, man)
            txn.commit()
    finally:
        ex.base.close()
        ex.tuned.close()
    return ExtractReport(**man, out=str(out))


__all__ = ["extract", "ExtractReport", "ModelFolder"]
