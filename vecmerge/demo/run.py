"""``vecmerge demo``: the user's v58 story end to end on toy trajectories it trains itself.

It trains a tiny random Qwen3 with LoRA (``trajectories.py``: v28, its continuation v51, a backbone
v54e2 -> v54), evaluates each checkpoint several times (``evals.csv``, three sub-tasks), then runs the very
commands a user types, printing each one first: inspect, audit, evidence import / show / compare, gate,
project, verify, probe, evidence calibrate --loo, a dose ladder, probe and rank over it, then a step protected on
two sub-tasks raising the third (``--protect``, ``--target``, two energies, two doses), probed per sub-task and
drawn as ``protect.png`` (``report.protect``). It ends with the folder to upload and its sha256. Every command
runs in the demo folder, whose ``vecmerge.yaml`` names the checkpoints, and calls the same ``commands`` function
the CLI calls for that command line. The full command list and what each part shows: docs/design/demo.md.
"""

from __future__ import annotations

import contextlib
import csv
import json
import os
import shlex
import time
from pathlib import Path

from .. import commands
from .. import requests as rq
from ..errors import CheckFailed, OutputError, VecmergeError
from ..outputs.manifest import read_manifest
from ..outputs.policy import DEMO_MARKER as MARKER
from ..outputs.policy import OutputPolicy
from ..outputs.transaction import discard_folder
from ..recipe.recipe import Recipe
from ..workspace.names import Workspace
from .trajectories import HISTORY, METRIC, SUBTASKS, evaluate_checkpoints, make_trajectories, write_probe_prompts

V58 = {"base": "v54", "dir": "v51-v28", "trust": 0.0113, "consensus": {"ref": "v54-v54e2"}, "gate": True,
       "out": "out/v58"}
EVALS, HISTORY_EVALS = "evals.csv", "history.csv"
PROBES = "heldout.jsonl"
MAIN = ["v28", "v51", "v54e2", "v54"]
PAST = [*MAIN, *HISTORY]  # the twelve past checkpoints
PROXY = "probe:heldout:loglik"
DOSES = (0.5, 1, 1.456, 4)
LADDER = [f"out/dose-x{k:g}" for k in DOSES]
STEPS = [  # (the command line shown, the call it stands for)
    (["inspect", "v54", "v51"], lambda ws, echo: commands.inspect(ws, rq.Inspect(("v54", "v51")), echo=echo)),
    (["audit", "--ref", "v54-v54e2", "--dir", "v51-v28", "--by", "grid", "--plot", "audit.png"],
     lambda ws, echo: commands.audit(ws, rq.Audit(ref="v54-v54e2", direction="v51-v28", by="grid",
                                                      plot="audit.png"), echo=echo)),
    (["evidence", "import", EVALS, "--higher-is-better", METRIC],
     lambda ws, echo: commands.evidence_import(ws, rq.EvidenceImport((EVALS,), higher=(METRIC,)), echo=echo)),
    (["ls"], lambda ws, echo: commands.ls(ws, rq.Ls(), echo=echo)),
    (["evidence", "show"], lambda ws, echo: commands.evidence_show(ws, rq.EvidenceShow(), echo=echo)),
    (["evidence", "compare", "v51", "v28"],
     lambda ws, echo: commands.evidence_compare(ws, rq.EvidenceCompare("v51", "v28"), echo=echo)),
    (["gate", "--base", "v54", "--dir", "v51-v28", "--consensus-ref", "v54-v54e2", "--trust", "0.0113"],
     lambda ws, echo: commands.gate(ws, rq.Gate("v54", "v51-v28", consensus_ref="v54-v54e2", trust=0.0113), echo=echo)),
    (["project", "--base", "v54", "--dir", "v51-v28", "--trust", "0.0113", "--consensus-ref", "v54-v54e2",
      "--gate", "--out", "out/v58"],
     lambda ws, echo: commands.merge(ws, Recipe.from_dict(V58), rq.RunFlags(), echo=echo)),
    (["verify", "out/v58", "--base-model", "base"],
     lambda ws, echo: commands.verify(ws, rq.Verify(("out/v58",), base_model="base"), echo=echo)),
    (["evidence", "import", HISTORY_EVALS],
     lambda ws, echo: commands.evidence_import(ws, rq.EvidenceImport((HISTORY_EVALS,)), echo=echo)),
    (["probe", *PAST, "--prompts", PROBES],
     lambda ws, echo: commands.probe(ws, rq.Probe(tuple(PAST), prompts=PROBES), echo=echo)),
    (["evidence", "calibrate", "--proxy", PROXY, "--target", METRIC, "--loo"],
     lambda ws, echo: commands.evidence_calibrate(ws, rq.EvidenceCalibrate((PROXY,), METRIC, loo=True), echo=echo)),
    (["project", "--base", "v54", "--dir", "v51-v28", "--trust", "0.0113", "--consensus-ref", "v54-v54e2", "--dose",
      ",".join(f"{k:g}" for k in DOSES), "--out", "out/dose"],
     lambda ws, echo: commands.merge(ws, Recipe.from_dict({**{k: v for k, v in V58.items() if k != "gate"},
                                                           "dose": list(DOSES), "out": "out/dose"}), rq.RunFlags(),
                                     echo=echo)),
    (["probe", *LADDER, "--prompts", PROBES],
     lambda ws, echo: commands.probe(ws, rq.Probe(tuple(LADDER), prompts=PROBES), echo=echo)),
    (["rank", *LADDER, "--proxy", PROXY, "--target", METRIC],
     lambda ws, echo: commands.rank(ws, rq.Rank(tuple(LADDER), (PROXY,), METRIC), echo=echo)),
]
TARGET, HELD = SUBTASKS[0], SUBTASKS[1:]  # the protected step raises one sub-task and holds the other two
ENERGIES, PDOSES = (0.5, 0.9), (1, 4)
PROTECTED = [f"out/protect-e{e:g}-x{k:g}" for e in ENERGIES for k in PDOSES]
FRONT = ["v54", *(f"out/dose-x{k:g}" for k in PDOSES), *PROTECTED]
PROTECT_FLAGS = [*(x for t in HELD for x in ("--protect", f"{t}=heldout-{t}.jsonl")), "--target",
                 f"{TARGET}=heldout-{TARGET}.jsonl", "--protect-energy", ",".join(f"{e:g}" for e in ENERGIES)]
STEPS += [
    (["project", "--base", "v54", "--dir", "v51-v28", "--trust", "0.0113", "--consensus-ref", "v54-v54e2",
      *PROTECT_FLAGS, "--dose", ",".join(f"{k:g}" for k in PDOSES), "--out", "out/protect"],
     lambda ws, echo: commands.merge(ws, Recipe.from_dict({
         **{k: v for k, v in V58.items() if k != "gate"}, "dose": list(PDOSES), "out": "out/protect",
         "protect": {t: f"heldout-{t}.jsonl" for t in HELD}, "target": {TARGET: f"heldout-{TARGET}.jsonl"},
         "protect_energy": list(ENERGIES)}), rq.RunFlags(), echo=echo)),
    (["probe", *FRONT, "--prompts", PROBES],
     lambda ws, echo: commands.probe(ws, rq.Probe(tuple(FRONT), prompts=PROBES), echo=echo)),
]
SMALL = {"layers": 1, "steps": 40, "hidden": 64, "rank": 4}
RUNS, SUBSET, POOL = 5, 64, 512  # evaluations per checkpoint, items per run, held-out sequences


@contextlib.contextmanager
def _cwd(path: Path):
    old = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(old)


def prepare_folder(out, force: bool) -> Path:
    """Create ``out``; an existing one is replaced only with ``force`` and only if vecmerge made it.

    The rule is every output's (``outputs.policy``): an empty folder, a demo folder (its marker file) or
    a vecmerge output may be replaced, a folder of the user's never. The old folder is deleted
    crash-safely (``outputs.transaction.discard_folder``); the demo then builds in place and marks the folder first.
    """
    out = Path(out)
    policy = OutputPolicy.for_command(force=force)
    policy.check_folder(out)
    discard_folder(out, policy=policy)
    try:
        out.mkdir(parents=True)
        (out / MARKER).write_text("made by vecmerge demo; safe to delete\n")
    except OSError as e:
        raise OutputError(f"--out {out}: cannot create it ({e.strerror or e}); choose another --out") from None
    return out


def write_evals(path: Path, rows: list[dict]) -> None:
    """The evaluations as a ledger CSV (``model,metric,value,item,note,subscore,sub.<task>...``; ``vecmerge
    evidence import`` reads it): a run's sub-scores in ``sub.<task>``, an item's sub-task in ``subscore``."""
    subs = [f"sub.{t}" for t in SUBTASKS]
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, ["model", "metric", "value", "item", "note", "subscore", *subs], lineterminator="\n")
        writer.writeheader()
        writer.writerows({**r, **{k: repr(r[k]) for k in ("value", *subs) if r.get(k) is not None}} for r in rows)


def split_by_task(path: Path) -> None:
    """``heldout-<task>.jsonl`` beside ``path``: its lines of each sub-task, in order."""
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    for t in SUBTASKS:
        mine = [ln for ln in lines if json.loads(ln).get("task") == t]
        (path.parent / f"heldout-{t}.jsonl").write_text("".join(mine), encoding="utf-8")


def protect_frontier(probed: dict, path: Path) -> tuple[Path, list]:
    """The protected-step PNG from the probe of ``FRONT`` (changes per sub-task from v54, its first model), and its
    points.

    ``gain`` = the change of ``TARGET``'s mean log-likelihood per item, ``drops`` = minus the change of each held
    sub-task's; one series for the plain doses, one per energy (``report.protect.frontier_png``).
    """
    from ..report.protect import frontier_png

    rows = []
    for name in FRONT[1:]:
        ch = probed["models"][name]["summary"]["changes"]["tasks"]
        energy = float(name.split("-e")[1].split("-x")[0]) if "-e" in name else None
        rows.append({"trust": float(name.rsplit("-x", 1)[1]), "energy": energy, "gain": ch[TARGET]["change"],
                     "drops": [-ch[t]["change"] for t in HELD]})
    return frontier_png(rows, path, label="dose"), rows


def run_demo(out="demo-out", *, force: bool = False, small: bool = False, quiet: bool = False,
             echo=print, seed: int = 0) -> dict:
    """Train toy trajectories in ``out``, evaluate them, and run inspect, audit, the evidence commands, the
    gate, project and verify there; then probe, calibrate the probe and rank a dose ladder by it.

    Args:
        out (str | Path): the demo folder. force (bool): replace an earlier demo folder.
        small (bool): the smallest settings (tests). quiet (bool): no progress bars.
        echo (callable): where the transcript goes. seed (int): training seed.

    Returns:
        {"out": adapter folder, "sha256": weights sha256, "seconds": {...}, "protect": the PNG's points}.
    """
    folder = prepare_folder(out, force).resolve()
    seconds = {}
    t0 = time.perf_counter()
    echo(f"# training toy trajectories (tiny random Qwen3 + LoRA on q/k/v/o/gate/up/down) in {out}, keeping each "
         f"run's other half epochs too ({', '.join(HISTORY)})")
    make_trajectories(folder, seed=seed, progress=not quiet, history=True, **(SMALL if small else {}))
    with open(folder / "vecmerge.yaml", "a", encoding="utf-8") as f:  # the sub-tasks are constraints of the merge
        f.write(f"gate:\n  protect: [{', '.join(SUBTASKS)}]  # sub-scores that must not regress\n")
        f.write(f"metric: {METRIC}  # the probe's metrics join it in the ledger\n")
    seconds["train"] = time.perf_counter() - t0
    t = time.perf_counter()
    echo(f"# evaluating each checkpoint {RUNS} times, each time on {SUBSET} fresh random sequences of {POOL} "
         f"held-out ones ({METRIC}: next-token accuracy; sub-scores {', '.join(SUBTASKS)}: the sequences starting "
         f"in each third of the vocabulary), into {EVALS} ({', '.join(MAIN)}) and {HISTORY_EVALS}")
    rows = evaluate_checkpoints(folder, PAST, seed=seed, runs=RUNS, subset=SUBSET, pool=POOL)
    write_evals(folder / EVALS, [r for r in rows if r["model"] in MAIN])
    write_evals(folder / HISTORY_EVALS, [r for r in rows if r["model"] not in MAIN])
    seconds["evaluate"] = time.perf_counter() - t
    write_probe_prompts(folder / PROBES, seed=seed)
    split_by_task(folder / PROBES)
    echo(f"# writing {PROBES} for vecmerge probe: 64 more held-out sequences, each 16 prompt tokens and 16 target "
         f"tokens; and heldout-<sub-task>.jsonl, its items of each sub-task (the protected step's prompt sets)")
    results: list = []
    with _cwd(folder):
        ws = Workspace()
        for args, call in STEPS:
            t = time.perf_counter()
            echo(f"\n$ vecmerge {shlex.join(args)}")
            lines: list[str] = []
            try:
                results.append(call(ws, lambda text, err=False, into=lines: into.append(text)))
            except VecmergeError as e:
                echo("\n".join(lines + [f"error: {e}"]))
                raise CheckFailed(f"demo step 'vecmerge {shlex.join(args)}' exited {e.exit_code}; see above") from None
            echo("\n".join(lines).rstrip())
            seconds[" ".join(args[:2])] = time.perf_counter() - t
    png, front = protect_frontier(results[-1], folder / "protect.png")
    echo(f"\n# {png.name}: {TARGET}'s gain against the worst drop of {' or '.join(HELD)} (mean log-likelihood per "
         f"item from v54; a negative drop is a rise), the plain step and the step protected at E "
         f"{', '.join(f'{e:g}' for e in ENERGIES)}, at doses {', '.join(f'{k:g}' for k in PDOSES)}")
    adapter = folder / "out" / "v58"
    sha = read_manifest(adapter)["output"]["sha256"]
    echo(f"\nuploadable adapter: {Path(out) / 'out' / 'v58'}")
    echo(f"sha256 (adapter_model.safetensors): {sha}")
    return {"out": adapter, "sha256": sha, "seconds": seconds, "protect": front}
