"""``make bench``: the evidence ledger's reads on a million records, each against a plain sqlite3 scan of its rows.

A ledger of ``--records`` records (default 1,000,000) is written straight into SQLite through the ledger's own schema:
``--models`` models, each with 5 whole runs of ``official_total`` (one sub-score) and the rest item-level records of
``probe:toy:loglik`` (50 clusters), then one record added through ``Ledger.add`` (which builds the ledger's indexes
and checks every stored row, as each write does: its time is shown too). Then, in this process, best of
``--repeat``:

    show            ``evidence show`` (every record)          against  SELECT every record
    show NAME       ``evidence show m01``                     against  SELECT m01's records
    compare         ``evidence compare m01 m02 --metric official_total``  against  SELECT that metric's records
    compare items   ``evidence compare m01 m02 --metric probe:toy:loglik`` (item level)  against  SELECT that
                    metric's records
    export csv      ``evidence export`` (streamed, written to /dev/null)  against  SELECT every record
    export json     ``evidence export --format json``         against  SELECT every record

The scan fetches the same columns of the same rows with ``sqlite3`` and nothing else: the floor of any read.
Each ratio is the command's time over its scan's, measured one after the other on the same file (the OS cache
warm for both). ``--before DIR`` (a source tree of older code, e.g. ``git archive main | tar -x -C DIR``) times
the same reads with that code too, in a child process on the same file right after, and adds the before/after
ratio. Progress goes to stderr; the table to stdout and ``OUT/ledger.md`` (raw figures: ``ledger.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from vecmerge import Ledger

# the evidence commands' reads, timed in-process, and the columns the plain scan reads
from vecmerge.commands.judging import compare_models
from vecmerge.commands.recording import export_lines
from vecmerge.commands.summaries import show
from vecmerge.evidence.ledger.schema import RECORD_COLUMNS

T0 = time.perf_counter()
METRIC, ITEMS = "official_total", "probe:toy:loglik"


def log(msg: str) -> None:
    print(f"[bench_ledger {time.perf_counter() - T0:6.1f}s] {msg}", file=sys.stderr, flush=True)


def build(path: Path, records: int, models: int) -> float:
    """Write the ledger (module docstring); returns the seconds of the one ``Ledger.add`` at the end."""
    ledger = Ledger(path)
    ledger.set_direction(METRIC, True)
    ledger.set_direction(ITEMS, True)
    rnd, sha, now = random.Random(0), "a" * 64, "2026-01-01T00:00:00Z"
    names = [f"m{i:02d}" for i in range(models)]
    runs = [(m, sha, METRIC, 0.9 + 0.1 * rnd.random(), json.dumps({"sub_a": rnd.random()}), None, None, None,
             "manual", None, now) for m in names for _ in range(5)]
    per = max(0, records - 1 - len(runs)) // models
    con = sqlite3.connect(path)
    sql = ("INSERT INTO records (model, sha256, metric, value, subs, stderr, item, cluster, source, note, created) "
           "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)")
    con.executemany(sql, runs)
    for m in names:
        con.executemany(sql, ((m, sha, ITEMS, -5 * rnd.random(), "{}", None, f"q{i}", f"c{i % 50}", "probe", None,
                               now) for i in range(per)))
    con.commit()
    con.close()
    t = time.perf_counter()
    ledger.add("m01", sha, METRIC, 0.95)
    return time.perf_counter() - t


def scan(path: Path, where: str = "", args=()) -> int:
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return len(con.execute(f"SELECT {RECORD_COLUMNS} FROM records {where} ORDER BY id", args).fetchall())
    finally:
        con.close()


def best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def export_to_null(ledger: Ledger, fmt: str) -> None:
    with open(os.devnull, "w") as f:
        for piece in export_lines(ledger, fmt):
            f.write(piece)


def cases_of(ledger: Ledger) -> list:
    """(name, the read, the WHERE clause and arguments of its plain scan) for each read measured."""
    return [
        ("show", lambda: show(ledger), ("",)),
        ("show NAME", lambda: show(ledger, ["m01"]), ("WHERE model = ?", ("m01",))),
        ("compare, run metric", lambda: compare_models(ledger, "m01", "m02", METRIC),
         ("WHERE metric = ?", (METRIC,))),
        ("compare, item metric", lambda: compare_models(ledger, "m01", "m02", ITEMS),
         ("WHERE metric = ?", (ITEMS,))),
        ("export csv", lambda: export_to_null(ledger, "csv"), ("",)),
        ("export json", lambda: export_to_null(ledger, "json"), ("",)),
    ]


def reads_only(path: Path, repeat: int) -> None:
    """``--reads-only DB``: each read's best time on an existing ledger, as JSON on stdout (``--before``'s child)."""
    with tempfile.TemporaryDirectory() as tmp:
        warm = Path(tmp) / "warm.db"
        build(warm, 400, 20)
        for _, fn, _ in cases_of(Ledger(warm)):
            fn()
    ledger = Ledger(path)
    print(json.dumps({name: best(fn, repeat) for name, fn, _ in cases_of(ledger)}))


def before_times(src: Path, path: Path, repeat: int) -> dict:
    """The reads' times with the code of ``src`` (a child process whose PYTHONPATH starts there)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src.resolve()), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, __file__, "--reads-only", str(path), "--repeat", str(repeat)], env=env,
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--records", type=int, default=1_000_000)
    p.add_argument("--models", type=int, default=20)
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--out", type=Path, default=Path("bench-out"))
    p.add_argument("--before", type=Path, help="A source tree of older code: its reads timed too, and the ratio.")
    p.add_argument("--reads-only", type=Path, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.reads_only:
        return reads_only(a.reads_only, a.repeat)
    with tempfile.TemporaryDirectory() as tmp:
        warm = Path(tmp) / "warm.db"  # the first call of each read imports its modules: not a ledger's cost
        build(warm, 400, a.models)
        for _, fn, _ in cases_of(Ledger(warm)):
            fn()
        path = Path(tmp) / "vecmerge-evidence.db"
        log(f"writing {a.records} records of {a.models} models")
        add_s = build(path, a.records, a.models)
        ledger = Ledger(path)
        n = scan(path)
        log(f"{n} records; one Ledger.add took {add_s:.2f} s")
        cases = cases_of(ledger)
        rows = []
        for name, fn, where in cases:
            s = best(lambda w=where: scan(path, *w), a.repeat)
            t = best(fn, a.repeat)
            rows.append({"read": name, "rows": scan(path, *where), "seconds": t, "scan_seconds": s,
                         "ratio": t / s if s else None})
            log(f"{name}: {t:.2f} s, scan {s:.2f} s")
        if a.before is not None:
            log(f"the same reads with the code of {a.before}")
            old = before_times(a.before, path, a.repeat)
            for r in rows:
                r["before_seconds"] = old.get(r["read"])
    was = a.before is not None
    lines = [f"ledger of {n} records ({a.models} models), best of {a.repeat}; one Ledger.add: {add_s:.2f} s", "",
             "| read | rows | seconds | sqlite3 scan | ratio |" + (" before s | before / now |" if was else ""),
             "|---|---:|---:|---:|---:|" + ("---:|---:|" if was else "")]
    lines += [f"| {r['read']} | {r['rows']} | {r['seconds']:.2f} | {r['scan_seconds']:.2f} | {r['ratio']:.1f}x |"
              + (f" {r['before_seconds']:.2f} | {r['before_seconds'] / r['seconds']:.1f}x |" if was else "")
              for r in rows]
    text = "\n".join(lines) + "\n"
    print(text)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "ledger.md").write_text(text)
    (a.out / "ledger.json").write_text(json.dumps({"records": n, "add_seconds": add_s, "reads": rows}, indent=2))


if __name__ == "__main__":
    main()
