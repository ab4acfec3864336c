"""An lm-eval output tree: the files of many runs, found in folders and matched, in any order.

lm-eval 0.4 writes each run under ``OUTPUT/MODEL_SANITIZED/`` as ``results_STAMP.json`` and, with
``--log_samples``, one ``samples_TASK_STAMP.jsonl`` per task, STAMP the run's start time
(``2024-05-01T12-00-00.123456``). So:

    expand   a folder given to ``import`` stands for every ``results_*.json`` and ``samples_*.jsonl`` under it
             (any depth, sorted); files given by name are kept as given
    match    a samples file belongs to the results file in its folder with the same STAMP; without a STAMP
             in its name (renamed), to the one results file of its folder when there is exactly one; else to
             none (its model must then come from ``--model`` or the only model of the results given)
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

from .. import EvidenceError

_STAMP = re.compile(r"_(\d{4}-\d{2}-\d{2}T[\d.:\-]+)\.jsonl?$")
_PATTERNS = ("results_*.json", "samples_*.jsonl")


def stamp(path: Path) -> str | None:
    """The run's time stamp in an lm-eval file name (``results_STAMP.json``, ``samples_TASK_STAMP.jsonl``)."""
    m = _STAMP.search(path.name)
    return m[1] if m else None


def expand(paths: Iterable[str | Path]) -> list[Path]:
    """Files as given, each folder replaced by the lm-eval files under it (sorted); a folder holding none raises.

    Args:
        paths: files and folders, as the user named them.
    """
    out: list[Path] = []
    for p in map(Path, paths):
        if not p.is_dir():
            out.append(p)
            continue
        found = sorted({f for pattern in _PATTERNS for f in p.rglob(pattern) if f.is_file()})
        if not found:
            raise EvidenceError(f"{p}: a folder with no lm-eval results_*.json or samples_*.jsonl under it; name "
                                "the files; nothing was recorded")
        out.extend(found)
    return list(dict.fromkeys(out))


def match_samples(results: Iterable[Path], samples: Iterable[Path]) -> dict[Path, Path | None]:
    """Each samples file -> the results file of its run (module docstring), or None.

    Args:
        results (Iterable[Path]): the results files imported. samples (Iterable[Path]): the samples files.
    """
    by_folder: dict[Path, list[Path]] = {}
    for r in results:
        by_folder.setdefault(r.resolve().parent, []).append(r)
    out: dict[Path, Path | None] = {}
    for s in samples:
        here = by_folder.get(s.resolve().parent, [])
        same = [r for r in here if stamp(s) is not None and stamp(r) == stamp(s)]
        out[s] = same[0] if len(same) == 1 else here[0] if len(here) == 1 and stamp(s) is None else None
    return out
