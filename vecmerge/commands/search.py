"""``vecmerge search`` once its flags are parsed: the search (``search/``), then the record, the PNG and the top K
written as PEFT LoRAs through the pipeline, each manifest pointing at the record (its path and sha256).

    OUT_DIR/search.json    the search record: id, space, seed, sampler, every candidate's recipe and figures
                           (and ``recipe_file``: the --recipe file's path and sha256, when one was given)
    OUT_DIR/front.png      target gain against the lower bound of the protected set nearest its margin
    OUT_DIR/top<i>         the i-th candidate by target gain, written by ``run(recipe)`` at rank exact

Nothing is written until the search has finished: Ctrl-C leaves the ledger's finished evaluations only. Each
output is written whole or not at all, the top K and the PNG first and the record last, so that a search.json
means a whole result; ``--resume`` replaces what an interrupted run wrote (only files and folders vecmerge wrote,
the output policy's ``force``).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from ..errors import UsageError
from ..evidence.ledger.ledger import Ledger
from ..io.safe_text import printable
from ..outputs.policy import FileKind
from ..outputs.transaction import PNG, OutputPolicy, write_file
from ..peft.write import OUTPUT_FILES
from ..pipeline.runner import run
from ..recipe.recipe import Recipe
from ..report import search as report_search
from ..report.format import to_json
from ..requests.search import Search
from ..workspace.base_model import checked_model_folder
from ..workspace.names import Workspace
from .progress import progress_bar

RECORD = "search.json"
FRONT = "front.png"
_HEAD = b'{\n  "tool": "vecmerge search"'
SEARCH_RECORD = FileKind("search record vecmerge wrote", lambda head: head.startswith(_HEAD))


def record_bytes(d: dict) -> bytes:
    """The search record as written (``tool`` first, so that a later run knows the file is its own)."""
    return json.dumps({"tool": "vecmerge search", **d}, indent=2, sort_keys=False).encode() + b"\n"


def check_writable(out: Path) -> None:
    """UsageError unless ``out`` (or its nearest existing parent, where it would be made) is a writable folder:
    checked before any computation, so that a search is not lost to a read-only --out-dir."""
    p = out.absolute()
    while not os.path.lexists(p) and p != p.parent:
        p = p.parent
    if not p.is_dir():
        raise UsageError(f"--out-dir {out}: {p} is not a folder; choose another --out-dir")
    if not os.access(p, os.W_OK | os.X_OK):
        raise UsageError(f"--out-dir {out}: {'it' if p == out.absolute() else p} is not writable; choose a folder "
                         "you can write, e.g. one in your home")


def search(ws: Workspace, req: Search, *, echo=print, progress=None, on_result=None) -> dict:
    """``vecmerge search --base B --dir D... --target N=P --protect N=P... --margin M --out-dir DIR``.

    Args:
        ws (Workspace). req (Search): the request (``requests/search.py``): without ``--resume`` a search whose
            first candidate the ledger already holds is refused (module docstring of ``search/engine.py``).
        echo: prints the report. progress: the progress-bar wrapper. on_result: called after each candidate (tests).
    """
    from ..search import engine, fanout
    from ..search.space import is_plain

    target, protect, budget, top_k, out_dir = req.target, req.protect, req.budget, req.top_k, req.out_dir
    folder = checked_model_folder(req.base_model, ws.base_model, "search")
    out = Path(out_dir)
    ledger = Ledger(ws.ledger_path)
    given = [req.recipe.path] if req.recipe is not None else []  # the recipe file, never an output
    policy = OutputPolicy.for_command(inputs=[ledger.path, *given, *target.values(), *protect.values()],
                                      workspace_adapters=ws.adapters, base_model=folder,
                                      force=req.force or req.resume)  # --resume: replace an interrupted run's
    policy.check_file(out / RECORD, SEARCH_RECORD, flag="--out-dir")
    policy.check_file(out / FRONT, PNG, flag="--out-dir")
    for i in range(top_k):
        policy.check_folder(out / f"top{i + 1}", flag="--out-dir", expected_entries=OUTPUT_FILES)
    check_writable(out)
    if req.workers:
        fanout.ray_module()  # a missing Ray is one line before any computation
    setup = engine.prepare(ws, base=req.base, dirs=list(req.dirs), target=target, protect=protect,
                           margin=req.margin, trust_max=req.trust_max, base_model=folder, depth=req.depth,
                           types=req.types, exclude=list(req.exclude), energies=req.energies, batch=req.batch,
                           record_to=ledger, progress=progress_bar(progress, "capture"))

    def first_check(r, results):
        # the plain doses' line search is the same for every seed: the first sampled candidate decides
        first = not is_plain(r.params) and all(is_plain(x.params) for x in results[:-1])
        if first and not req.resume and r.target and not r.computed:
            raise UsageError(f"search: the ledger {ledger.path} already holds this search's first candidate "
                             f"({r.sha256[:12]}); pass --resume to continue it, or another --seed")
        if on_result is not None:
            on_result(r, results)

    pool = None
    try:
        if req.workers:
            pool = fanout.Pool(setup, workers=req.workers)
        outcome = engine.run(setup, budget=budget, seed=req.seed, sampler=req.sampler, k=top_k,
                             progress=progress_bar(progress, "search"), on_result=first_check, pool=pool)
    finally:
        if pool is not None:
            pool.close()
        setup.scorer.close()
    d = outcome.to_dict()
    if req.recipe is not None:  # --recipe FILE: its path, sha256, keys and those flags replaced
        d["recipe_file"] = req.recipe.to_dict()
    data = record_bytes(d)
    sha = hashlib.sha256(data).hexdigest()
    out.mkdir(parents=True, exist_ok=True)
    # the top K and the PNG first, the record LAST: a search.json means the outputs are whole (Ctrl-C before it:
    # the same command with --resume replaces what was written)
    d["written"] = {}
    for i, r in enumerate(outcome.top):
        path = out / f"top{i + 1}"
        recipe = Recipe.from_dict({**r.recipe, "out": str(path)}, source=f"candidate {r.sha256[:12]}")
        source = {"format": "vecmerge search", "path": str(out / RECORD), "sha256": sha,
                  "notes": f"search {d['id']}: candidate {r.sha256}, top {i + 1} of {len(outcome.top)} by target "
                           f"gain {r.objective:+.6g}; its figures are in the record"}
        rep = run(recipe, ws, force=policy.force, source=source)
        d["written"][r.sha256] = str(rep.outputs[0].path)
    d["probed"] = probe_written(ws, setup, folder, list(d["written"].values()), req, progress)
    write_file(out / FRONT, lambda f: report_search.plot_front(d, f), policy=policy, kind=PNG, flag="--out-dir")
    write_file(out / RECORD, data, policy=policy, kind=SEARCH_RECORD, flag="--out-dir")
    d["record"] = {"path": str(out / RECORD), "sha256": sha, "png": str(out / FRONT)}
    echo(to_json(d) if req.as_json else printable(report_search.render_search(d), keep_newlines=True))
    return d


def probe_written(ws: Workspace, setup, base_model: Path, paths: list, req: Search, progress=None) -> list[str]:
    """Probe the written candidates (and the backbone, when it is one adapter) on every set, recorded in the ledger
    under their own content sha256, so ``vecmerge report TOP --vs BASE --metric probe:SET:loglik`` and ``evidence
    plan`` take them from there. Returns the names recorded (folders relative to the workspace).

    Args:
        ws (Workspace). setup: ``engine.prepare``'s (its ``sets``, ``ledger``). base_model (Path): the base folder.
        paths (list[str]): the written folders. req (Search): its ``base`` and ``batch``. progress: the bar wrapper.
    """
    from ..probe.runner import ProbeModel, run_probe

    root = Path(ws.root).resolve()
    names = [os.path.relpath(Path(p).resolve(), root) for p in paths]
    if req.base in ws.adapters or ws.content_sha(req.base) is not None:  # one adapter, not an expression
        names = [req.base, *names]
    models = [ProbeModel(n, ws.adapter(n), ws.content_sha(n)) for n in names]
    for prompts in setup.sets.values():
        run_probe(base_model, models, prompts, ledger=setup.ledger, batch=req.batch, pairs=False,
                  device=ws.device or "cpu", progress=progress_bar(progress, f"probe {prompts.stem}"))
    return names
