"""The v58 / v59 / v60 family on the demo's toy trajectories, and what goes wrong without safeguards.

    python examples/walkthrough.py [DEMO_DIR]     # default demo-out; runs `vecmerge demo` first if missing

Every step is a real `vecmerge` command run in DEMO_DIR (printed before its output), so each can be
typed by hand there. `make readme` pastes this transcript into examples/WALKTHROUGH.md.
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

RECIPES = Path(__file__).resolve().parents[1] / "recipes"
STEP = ["project", "--base", "v54", "--dir", "v51-v28", "--consensus-ref", "v54-v54e2"]

SECTIONS = [
    ("The family through recipes: v58 (the step that worked), v59 (45.6% further), v60 (orthogonal residual)",
     [["run", str(RECIPES / "v58.yaml"), "--force"], ["run", str(RECIPES / "v59.yaml"), "--force"],
      ["run", str(RECIPES / "v60.yaml"), "--force"]]),
    ("A dose ladder in one run: one adapter per multiple of alpha, all computation shared",
     [[*STEP, "--trust", "0.0113", "--dose", "0.5,1,1.456,4", "--out", "out/ladder", "--force"]]),
    ("Without safeguards 1: a rank cut that erases the step (the backbone's own rank keeps the backbone)",
     [[*STEP, "--trust", "0.0113", "--rank", "8", "--dry-run"],
      [*STEP, "--trust", "0.0113", "--rank", "8", "--strict", "--dry-run"]]),
    ("Without safeguards 2: bf16 storage rounds the whole update, and a 1% step drowns in it",
     [[*STEP, "--trust", "0.0113", "--dtype", "bf16", "--dry-run"]]),
    ("Without safeguards 3: an alpha that leaves the trust region is clipped, and says so",
     [[*STEP, "--alpha", "0.5", "--trust", "0.0113", "--dry-run"]]),
    ("Without safeguards 4: a direction the backbone's own training disagrees with is refused (exit 1)",
     [["project", "--base", "v54", "--dir", "v28-v51", "--consensus-ref", "v54-v54e2", "--trust", "0.0113",
       "--out", "out/wrong-way"]]),
    ("The gate: v59's dose (45.6% further) leaves the trust region, so --gate writes nothing (exit 1)",
     [[*STEP, "--trust", "0.0113", "--dose", "1.456", "--gate", "--out", "out/v59-gated"]]),
    ("The classic merges the user tried first: an average and a direct sum of two runs, then TIES in core space"
     " and DARE in full space (each verified like any output)",
     [["audit", "v54", "v51"],
      ["merge", "--method", "linear", "v54", "v51", "--weights", "0.5,0.5", "--out", "out/average", "--force"],
      ["merge", "--method", "linear", "v54", "v51", "--out", "out/direct-sum", "--force"],
      ["merge", "--method", "ties", "v54", "v51", "--density", "0.5", "--space", "core", "--out", "out/ties",
       "--force"],
      ["merge", "--method", "dare_ties", "v54", "v51", "--density", "0.5", "--seed", "1", "--rank", "16", "--out",
       "out/dare", "--force"],
      ["verify", "out/dare"]]),
]


def run_walkthrough(folder, echo=print) -> None:
    """Run every section's commands in ``folder`` (a demo folder), echoing a transcript."""
    from click.testing import CliRunner

    from vecmerge.cli import main

    runner = CliRunner()
    old = os.getcwd()
    os.chdir(folder)
    try:
        for title, commands in SECTIONS:
            echo(f"\n## {title}")
            for args in commands:
                shown = [a.replace(str(RECIPES), "../recipes") for a in args]
                echo(f"\n$ vecmerge {shlex.join(shown)}")
                res = runner.invoke(main, ["--quiet", *args], catch_exceptions=False)
                echo(res.output.rstrip())
                if res.exit_code:
                    echo(f"(exit {res.exit_code})")
    finally:
        os.chdir(old)


def main() -> int:
    folder = Path(sys.argv[1] if len(sys.argv) > 1 else "demo-out")
    if not (folder / "vecmerge.yaml").is_file():
        from vecmerge import run_demo

        run_demo(folder, force=True, quiet=True, echo=lambda s: None)
    run_walkthrough(folder)
    return 0


if __name__ == "__main__":
    sys.exit(main())
