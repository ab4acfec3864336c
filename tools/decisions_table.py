"""The table of docs/DECISIONS.md: planned looks against a fixed-n Welch test and the anytime mixture, by seeded
simulation through the decision code itself (``python tools/decisions_table.py``, about a minute).

Regime of issue 33: run sd 0.012, D 0.01, N 3/5/10 runs per model, true differences 0, 0.01, 0.0275; A and B
alternate, a look after every run (planned: once both have 2; mixture: likewise).
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats

from vecmerge.evidence.stats.planned import Design, decide_planned
from vecmerge.evidence.stats.sequential import decide_runs

SD, D, ALPHA, SIMS, MIXTURE_SIMS = 0.012, 0.01, 0.05, 10_000, 2_000


def alternate(a, b):
    return [r for p in zip((("A", x) for x in a), (("B", y) for y in b)) for r in p]


def main() -> None:
    print("| N | true diff | planned: better | planned: worse | planned: futile | planned: runs | fixed-n Welch: "
          "better | ratio | Pocock: better | anytime mixture: better |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for n in (3, 5, 10):
        for delta in (0.0, 0.01, 0.0275):
            rng = np.random.default_rng(1000 * n + int(delta * 1e4))
            xa, xb = rng.normal(delta, SD, (SIMS, n)), rng.normal(0.0, SD, (SIMS, n))
            runs = [alternate(a, b) for a, b in zip(xa, xb)]
            got = [decide_planned(r, min_effect=D, max_runs=n, alpha=ALPHA) for r in runs]
            rate = {k: np.mean([g.decision == k for g in got]) for k in ("stop_better", "stop_worse", "stop_futile")}
            used = np.mean([sum(g.runs) for g in got])
            pocock = np.mean([decide_planned(r, min_effect=D, max_runs=n, alpha=ALPHA, design=Design("pocock"))
                              .decision == "stop_better" for r in runs])
            res = stats.ttest_ind(xa, xb, axis=1, equal_var=False)
            welch = np.mean((res.pvalue < ALPHA) & (res.statistic > 0))
            mixture = np.mean([decide_runs(r, min_effect=D, max_runs=n, alpha=ALPHA, prior_scale=D / SD).decision
                               == "stop_better" for r in runs[:MIXTURE_SIMS]])
            ratio = "-" if delta == 0 else f"{rate['stop_better'] / welch:.3f}"
            print(f"| {n} | {delta:g} | {rate['stop_better']:.4f} | {rate['stop_worse']:.4f} | "
                  f"{rate['stop_futile']:.4f} | {used:.2f} | {welch:.4f} | {ratio} | {pocock:.4f} | {mixture:.4f} |")
    print(f"\nMonte Carlo se at p: sqrt(p(1-p)/{SIMS}) (at 0.025: {math.sqrt(0.025 * 0.975 / SIMS):.4f}); "
          f"mixture column over {MIXTURE_SIMS} draws")


if __name__ == "__main__":
    main()
