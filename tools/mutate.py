"""`make mutate`: mutation testing (mutmut) of the modules where a silent error would hurt, and its score.

    python tools/mutate.py run                a fresh mutmut run of every selected mutant, then the report
    python tools/mutate.py run MODULE ...     run again the mutants of these modules (e.g. vecmerge.analysis.step),
                                              keeping the other results of the last run in mutants/
    python tools/mutate.py report [MODULE ...] the score per module of the last run, from mutants/*.meta

What is mutated: ``[mutmut] only_mutate`` (files) and ``[mutmut:select] mutants`` (mutant-name patterns:
whole modules, or the functions that matter in a larger one) in setup.cfg. Which tests judge each module:
``[mutmut:tests]`` (tests/conftest.py deselects the others while a mutant runs). A survivor that is
equivalent to the original (no test could ever tell them apart) is listed, with the reason, in
docs/MUTATION.md's table of equivalent mutants (`| `name` | reason |` rows); the score leaves them out:

    score = (killed + timeout) / (mutants - equivalent)

Survivors not in that table are printed: kill each with a test, or add it to the table with the reason.
"""

from __future__ import annotations

import argparse
import configparser
import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHILDREN = int(os.environ.get("MUTATE_CHILDREN", "1"))  # workers; 1 keeps a core free on a 2-core machine

KILLED, SURVIVED, TIMEOUT, NO_TESTS, NOT_CHECKED, OTHER = "killed", "survived", "timeout", "no tests", \
    "not checked", "suspicious"
STATUS = {1: KILLED, 3: KILLED, 0: SURVIVED, 5: NO_TESTS, 33: NO_TESTS, None: NOT_CHECKED,
          24: TIMEOUT, -24: TIMEOUT, 36: TIMEOUT, 152: TIMEOUT, 255: TIMEOUT,
          2: TIMEOUT}  # 2: pytest interrupted, as when mutmut stops a run past its time budget (a test hung)


def selection(modules: list[str]) -> list[str]:
    """The mutant-name patterns of ``[mutmut:select]``, only those of ``modules`` when given."""
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    patterns = cfg.get("mutmut:select", "mutants").split()
    if modules:
        patterns = [p for p in patterns if any(p.startswith(m + ".") for m in modules)]
        if not patterns:
            sys.exit(f"error: no pattern of [mutmut:select] in setup.cfg is in {', '.join(modules)}")
    return patterns


def equivalents() -> dict[str, str]:
    """``{mutant name: reason}`` from docs/MUTATION.md's rows ``| `vecmerge....__mutmut_N` | reason |``."""
    rows = re.findall(r"^\| `(vecmerge\.[^`]+__mutmut_\d+)` \| (.+?) \|\s*$",
                      (ROOT / "docs" / "MUTATION.md").read_text(), flags=re.M)
    return dict(rows)


def results(patterns: list[str]) -> dict[str, str]:
    """``{mutant name: status}`` of every mutant of the last run that the patterns select."""
    out = {}
    for meta in sorted((ROOT / "mutants").rglob("*.py.meta")):
        for name, code in json.loads(meta.read_text())["exit_code_by_key"].items():
            if any(fnmatch.fnmatchcase(name, p) for p in patterns):
                out[name] = STATUS.get(code, OTHER)
    return out


def module_of(mutant: str) -> str:
    return mutant.rpartition(".")[0]


def report(patterns: list[str]) -> int:
    """Print the score per module and the undocumented survivors; 1 if there are any."""
    res, eq = results(patterns), equivalents()
    if not res:
        sys.exit("error: no results in mutants/; run `make mutate` first")
    rows, total = {}, Counter()
    for name, status in res.items():
        if status == SURVIVED and name in eq:
            status = "equivalent"
        rows.setdefault(module_of(name), Counter())[status] += 1
        total[status] += 1
    cols = [KILLED, SURVIVED, "equivalent", TIMEOUT, NO_TESTS, NOT_CHECKED, OTHER]

    def line(label, c):
        n = sum(c.values())
        live = n - c["equivalent"]
        score = (c[KILLED] + c[TIMEOUT]) / live if live else 1.0
        return f"| {label} | {n} | " + " | ".join(str(c[k]) for k in cols) + f" | {score:.1%} |"

    print("| module | mutants | " + " | ".join(cols) + " | score |")
    print("|---" * (len(cols) + 3) + "|")
    for module in sorted(rows):
        print(line(f"`{module}`", rows[module]))
    print(line("**all**", total))
    open_ = sorted(n for n, s in res.items() if s in (SURVIVED, NO_TESTS, OTHER) and n not in eq)
    stale = sorted(n for n in eq if n in res and res[n] != SURVIVED)
    if stale:
        print(f"\n{len(stale)} mutants documented as equivalent were killed (remove them from docs/MUTATION.md):")
        print("\n".join(f"  {n}" for n in stale))
    if open_:
        print(f"\n{len(open_)} survivors neither killed nor documented as equivalent "
              "(`mutmut show NAME` shows one):")
        print("\n".join(f"  {n} ({res[n]})" for n in open_))
    return 1 if open_ else 0


def run(patterns: list[str], fresh: bool) -> int:
    """A mutmut run of the selected mutants (``fresh``: from scratch), then the report."""
    if fresh:
        shutil.rmtree(ROOT / "mutants", ignore_errors=True)
    else:  # mutmut does not copy a changed source again, and maps only tests its stats file has not seen:
        # drop that file and the rerun modules' copies, results and spans (the other modules' results stay)
        (ROOT / "mutants" / "mutmut-stats.json").unlink(missing_ok=True)
        for module in {re.split(r"\.(?:x[_?]|\*)", p)[0] for p in patterns}:
            for suffix in (".py", ".py.meta", ".py.spans"):
                (ROOT / "mutants" / (module.replace(".", "/") + suffix)).unlink(missing_ok=True)
    mutmut = Path(sys.executable).parent / "mutmut"
    start = time.monotonic()
    done = subprocess.run([str(mutmut), "run", "--max-children", str(CHILDREN), *patterns], cwd=ROOT)
    print(f"\nmutmut run: exit {done.returncode}, {time.monotonic() - start:.0f} s wall\n")
    return report(patterns) or done.returncode


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", choices=["run", "report"])
    ap.add_argument("modules", nargs="*", help="only these modules (e.g. vecmerge.analysis.step); default: all")
    args = ap.parse_args(argv)
    patterns = selection(args.modules)
    if args.command == "report":
        return report(patterns)
    return run(patterns, fresh=not args.modules)


if __name__ == "__main__":
    sys.exit(main())
