"""The user's published scores through the evidence library (what `vecmerge evidence show/compare` print).

    python examples/evidence/walkthrough.py            # a throwaway ledger in a temporary folder
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from vecmerge import Ledger, compare_records, import_files, pooled_noise, runs_by_model, summarize_records

HERE = Path(__file__).parent
METRIC = "official_total"


def main() -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        ledger = Ledger(Path(tmp) / "vecmerge-evidence.db")
        ledger.set_direction(METRIC, higher_is_better=True)
        import_files(ledger, [HERE / "scores.csv"])
        records = ledger.records(metric=METRIC)
        print("show:")
        for s in summarize_records(records):
            ci = f"[{s.ci_low:.4f}, {s.ci_high:.4f}]" if s.ci_low is not None else "-"
            std = f"{s.std:.4f}" if s.std is not None else "-"
            print(f"  {s.model:4} {s.sub or METRIC:18} n={s.n} mean={s.mean:.5f} std={std} 95% CI={ci} "
                  f"range={s.range:.4f}{'  (single run)' if s.single_run else ''}")
        noise = pooled_noise(runs_by_model(records))
        print(f"pooled within-model noise: sd {noise.sd:.4f} over {', '.join(noise.models)} ({noise.df} df)")
        out = {}
        for a, b in (("v51", "v28"), ("v59", "v58"), ("v58", "v51")):
            c = compare_records(a, b, records, higher_is_better=True)
            w = c.welch
            tail = (f"diff {w.diff:+.5f}, 95% CI [{w.ci_low:.5f}, {w.ci_high:.5f}], p {w.p:.4f}, df {w.df:.2f}"
                    if w else "; ".join(c.reasons[:1]))
            print(f"compare {a} {b}: {c.verdict} ({tail}); runs per model to detect {c.detect:.4f}: "
                  f"{c.repeats_needed}")
            out[(a, b)] = c
        return out


if __name__ == "__main__":
    main()
