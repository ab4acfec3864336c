"""The inputs of ``vecmerge evidence compare/plan/decide/calibrate``, ``rank`` and ``report``, one request each.

Each class's docstring is its command's ``--help``; each field is one option (``spec.option``).
"""

from __future__ import annotations

from dataclasses import dataclass

from .shared import ENV, JSON, METRIC, MIN_MODELS, PROXY, STALE, VS
from .spec import Request, Spec, argument, option, positive


def _above_zero(flag: str, what: str):
    """A check: a number > 0 (infinity allowed), else ``FLAG VALUE: WHAT``."""
    return lambda v: None if v > 0 else f"{flag} {v}: {what}"


@dataclass(frozen=True)
class EvidenceCompare(Request):
    """Is A better than B beyond eval noise? Welch over runs; paired and clustered over items.

    Every sub-score too: its test (Welch or paired per item), Holm-adjusted p across sub-scores, its grid
    step where its values lie on one, and what the difference costs the others (worse beyond noise, shown
    not worse at the margin, or unknown). Runs of different eval environments are not the same measurement:
    refused, naming the fields that differ, unless --env picks one. Replicate groups: their variance
    components and a test over trainings.
    """

    a: str = argument(required=True)
    b: str = argument(required=True)
    metric: str | None = option(METRIC, help="The metric (default: metric: in vecmerge.yaml, or the one A and B "
                                "share).")
    detect: float | None = option(Spec("--detect", "A difference to plan repeats for (default: the observed one).",
                                       kind="float", check=_above_zero("--detect", "a difference > 0")))
    target: str | None = option(Spec("--target", "The sub-score being raised: reported, not counted among the "
                                     "others' costs."))
    margin: float | None = option(Spec("--margin", "Non-inferiority margin for every sub-score (default: one grade "
                                       "where its values lie on a grid, else its pooled run noise sd).", kind="float",
                                       check=positive("--margin", "a difference > 0 in the metric's units")))
    include_stale: bool = option(STALE)
    env: tuple = option(ENV)
    as_json: bool = option(JSON)


def _within(flag: str, low: float, high: float, what: str, low_open: bool = True):
    def check(v: float) -> str | None:
        ok = (low < v if low_open else low <= v) and v < high
        return None if ok else f"{flag} {v}: {what}"

    return check


@dataclass(frozen=True)
class EvidencePlan(Request):
    """Pre-register a comparison of A against B: its power before a run is spent; later runs are its looks.

    A plan is immutable (a new one is a new record); it keeps both adapters' sha256, D, N, alpha, the test and
    its design. Below 50% power at D it warns and names the runs that reach 80%.
    """

    a: str = argument(required=True)
    b: str = option(VS)
    metric: str | None = option(METRIC)
    min_effect: float = option(Spec("--min-effect", "D: the smallest difference worth finding (the metric's units, "
                                    "its direction).", kind="float", required=True,
                                    check=positive("--min-effect", "a difference > 0")))
    max_runs: int = option(Spec(
        "--max-runs", "N: the most runs of each model the plan spends.", kind="int", required=True,
        check=lambda v: None if 2 <= v <= 100_000 else f"--max-runs {v}: at least 2 (a look needs two runs of each "
        "model), at most 100000"))
    alpha: float = option(Spec("--alpha", "The error rate (two-sided: better or worse).", kind="float", default=0.05,
                               shown=True, check=_within("--alpha", 0, 1, "between 0 and 1, e.g. 0.05")))
    kind: str = option(Spec("--kind", "Planned looks with power, or the anytime-valid mixture (any number of looks).",
                            kind="choice", choices=("group-sequential", "anytime"), default="group-sequential",
                            shown=True))
    spending: str = option(Spec("--spending", "Alpha spending of planned looks: O'Brien-Fleming-like or Pocock-like "
                                "(Lan-DeMets).", kind="choice", choices=("obf", "pocock"), default="obf", shown=True))
    look_every: int = option(Spec("--look-every", "Runs between planned looks.", kind="int", default=1, shown=True))
    beta: float = option(Spec("--beta", "Futility: stop_futile is said with probability at most beta when A leads by "
                              "D (0: no futility stop).", kind="float", default=0.1, shown=True,
                              check=_within("--beta", 0, 1, "in [0, 1), e.g. 0.1 (0: no futility stop)", False)))
    use_existing: bool = option(Spec("--use-existing", "Count A's and B's runs recorded before the plan (of these "
                                     "weights) as its first look.", kind="flag"))
    higher_is_better: bool | None = option(Spec("--higher-is-better/--lower-is-better", "The metric's direction "
                                                "(recorded when the ledger has none).", kind="pair"))
    noise_sd: float | None = option(Spec("--noise-sd", "The run-to-run sd for the power figures (default: the "
                                         "ledger's pooled noise).", kind="float",
                                         check=positive("--noise-sd", "a run-to-run sd > 0 in the metric's units")))
    as_json: bool = option(JSON)

    def relations(self) -> list[str]:
        out = []
        if not 1 <= self.look_every <= self.max_runs:
            out.append(f"--look-every {self.look_every}: between 1 and --max-runs")
        if self.a == self.b:
            out.append(f"evidence plan: A and --vs are both {self.a}")
        return out

    @property
    def test(self) -> str:
        """The plan's test as the ledger names it: group-sequential or t-mixture (``--kind anytime``)."""
        return "t-mixture" if self.kind == "anytime" else self.kind


@dataclass(frozen=True)
class EvidenceDecide(Request):
    """The latest plan's decision: stop_better, stop_worse, stop_futile, inconclusive (budget spent) or continue.

    Planned looks (default): a group-sequential Welch test at the plan's looks (evidence/planned.py). Anytime
    plans: a look after every run, the error rate kept whatever the number of looks (evidence/sequential.py).
    """

    a: str = argument(required=True)
    b: str = option(VS)
    metric: str | None = option(METRIC, help="The plan's metric (needed only when A and B have plans on several).")
    replay: bool = option(Spec("--replay", "The decision after each look, in recording order.", kind="flag"))
    env: tuple = option(ENV)
    as_json: bool = option(JSON)


@dataclass(frozen=True)
class EvidenceCalibrate(Request):
    """Can PROXY rank candidates like TARGET? Spearman, Kendall (bootstrap CIs), pairwise accuracy, noise ceiling.

    With --loo each model's TARGET is predicted by a least-squares fit (intercept and PROXY slopes) on the other
    models, and those held-out predictions are judged: what a new candidate's prediction would be worth.
    """

    proxy: tuple = option(PROXY, help="The cheap metric, e.g. local_cv (P1,P2 with --loo: a fit of several).")
    target: str = option(Spec("--target", "The metric that matters, e.g. official_total.", required=True))
    loo: bool = option(Spec("--loo", "Leave-one-model-out: judge a least-squares fit on models it never saw.",
                            kind="flag"))
    min_models: int | None = option(MIN_MODELS)
    env: tuple = option(ENV)
    as_json: bool = option(JSON)

    def relations(self) -> list[str]:
        if self.target in self.proxy:
            return [f"evidence calibrate: --proxy and --target are both {self.target}; calibrate one metric against "
                    "another"]
        return []


@dataclass(frozen=True)
class Rank(Request):
    """Rank CANDIDATES (a dose ladder, merges) by PROXY, or say it is a disaster detector only.

    With --target, PROXY is calibrated leave-one-model-out against TARGET on the past models (the candidates
    left out); when that calibration ranks candidates, they are ranked by the predicted TARGET, beside its
    held-out accuracy. Otherwise they are listed unranked, and those far below the others are flagged.
    """

    candidates: tuple = argument(nargs=-1, required=True)
    proxy: tuple = option(PROXY, help="The ledger metric(s) to rank by, e.g. probe:toy:loglik (P1,P2: a fit).")
    target: str | None = option(Spec("--target", "The metric that matters; the proxy is calibrated against it on past "
                                     "models first."))
    min_models: int | None = option(MIN_MODELS, help="Past models needed before a proxy may rank (default 8).")
    env: tuple = option(ENV)
    as_json: bool = option(JSON)

    def relations(self) -> list[str]:
        out = []
        if self.target is not None and self.target in self.proxy:
            out.append(f"rank: --target {self.target} is also a --proxy; rank by another metric")
        if len(set(self.candidates)) != len(self.candidates):
            out.append(f"rank: name each candidate once (got {', '.join(self.candidates)})")
        return out


def _markdown(v) -> str | None:
    from pathlib import Path

    if Path(v).suffix.lower() == ".md":
        return None
    return f"--out {v}: give a file name ending in .md (the HTML goes beside it as .html)"


@dataclass(frozen=True)
class Report(Request):
    """Which of CANDIDATES to submit, judged against --vs on the ledger's records.

    Per candidate: the total with its interval against the backbone, every sub-score's non-inferiority row, the
    plan's state, the gate it passed (a vecmerge output's manifest), probes and their calibration; then a
    recommendation with its reasons. Both files are written or neither.
    """

    candidates: tuple = argument(nargs=-1, required=True)
    vs: str = option(VS, help="The backbone every candidate is judged against.")
    metric: str | None = option(METRIC, help="The metric (default: metric: in vecmerge.yaml, or the one the models "
                                "share).")
    out: str = option(Spec("--out", "The Markdown file (FILE.md); FILE.html, with the plots inline, is written "
                           "beside it.", kind="path", path={"dir_okay": False}, required=True,
                           check=_markdown))
    force: bool = option(Spec("--force", "Replace a report this command wrote before (never another file).",
                              kind="flag"))
    env: tuple = option(ENV)


__all__ = ["EvidenceCompare", "EvidencePlan", "EvidenceDecide", "EvidenceCalibrate", "Rank", "Report"]
