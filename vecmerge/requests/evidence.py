"""The inputs of ``vecmerge evidence add/import/export/show``, ``ls`` and ``gate``, one request each.

Each class's docstring is its command's ``--help``; each field is one option (``spec.option``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .shared import DECIMALS, ENV, FORCE, JSON, METRIC, PLOT, STALE
from .spec import Problem, Request, Spec, argument, option, positive


def _written(text: str) -> Any:
    """``text`` as a float that keeps its text (``io.parse.Written``); ValueError when it is no number."""
    from ..io.parse import Written

    return Written(text.strip())


def parse_subs(pairs) -> dict[str, list]:
    """``KEY=V`` (one run) or ``KEY=V1,V2,...`` (one value per run, in order) -> key -> list of floats."""
    out: dict[str, list] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        try:
            values = [_written(v) for v in value.split(",")]
        except ValueError:
            sep = ""
        if not sep or not key.strip():
            raise Problem(f"--sub {pair!r}: give KEY=VALUE with a number, e.g. --sub item_understanding=0.2453 (or "
                          "one value per run: KEY=V1,V2,...)")
        if key.strip() in out:
            raise Problem(f"--sub {key.strip()} given twice; give every run's value at once: --sub "
                          f"{key.strip()}=V1,V2,...")
        out[key.strip()] = values
    return out


def parse_env_fields(options) -> dict[str, str]:
    """``--env KEY=VALUE`` options (repeatable) -> fields; a problem for one without ``=`` or a value."""
    out: dict[str, str] = {}
    for text in options or ():
        key, sep, value = text.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise Problem(f"--env {text!r}: give KEY=VALUE, e.g. --env temperature=0 (repeatable)")
        if key.strip() in out:
            raise Problem(f"--env {key.strip()} given twice; keep one")
        out[key.strip()] = value
    return out


ENV_FIELDS = ENV.with_help("", metavar="KEY=VALUE", parse=parse_env_fields)


@dataclass(frozen=True)
class EvidenceAdd(Request):
    """Record runs of NAME: one VALUE per run (negative values: put -- before them).

    A NAME that is no adapter here is recorded as an external model (no sha256); one within two edits of a
    workspace name is refused with "did you mean ...?" (--external records it anyway).
    """

    name: str = argument(required=True)
    values: tuple = argument(nargs=-1, required=True, kind="written")
    metric: str | None = option(METRIC, help="What was measured (default: metric: in vecmerge.yaml).")
    subs: Mapping[str, Any] = option(Spec(
        "--sub", "A sub-score KEY=VALUE of a single run, or KEY=V1,V2,... with one value per run in the runs' order "
        "(repeatable, one per sub-score).", multiple=True, parse=parse_subs))
    note: str | None = option(Spec("--note", "Free text kept with each record."))
    higher_is_better: bool | None = option(Spec("--higher-is-better/--lower-is-better",
                                                "Declare the metric's direction (once per metric).", kind="pair"))
    env: Mapping[str, str] = option(ENV_FIELDS, help="A field of the runs' eval environment (repeatable): harness, "
                                    "harness_version, task_version, n_shot, temperature, max_tokens, stop, timeout, "
                                    "seed, or any other KEY.")
    external: bool = option(Spec("--external", "Record NAME as an external model even when it is close to a "
                                 "workspace name.", kind="flag"))
    decimals: int | None = option(DECIMALS)
    as_json: bool = option(JSON)


@dataclass(frozen=True)
class EvidenceImport(Request):
    """Import FILES: CSV (model,metric,value[,note,item,cluster,sub.KEY]), lm-eval results .json, samples .jsonl;
    a folder: every lm-eval results_*.json and samples_*.jsonl under it (each samples file with its run's results).

    Every file is read before anything is written; a malformed row is one error line and nothing is recorded.
    """

    files: tuple = argument(nargs=-1, required=True, kind="path")
    model: str | None = option(Spec("--model", "The model name for lm-eval files (default: from their model_args)."))
    cluster_field: str | None = option(Spec("--cluster-field", "A field of each --log_samples doc to cluster items by "
                                            "(e.g. topic; dotted for nested)."))
    task: str | None = option(Spec("--task", "Only this lm-eval task of the samples files."))
    higher: tuple = option(Spec("--higher-is-better", "Declare that higher METRIC is better (repeatable; lm-eval "
                                "files declare their own).", multiple=True, metavar="METRIC"))
    lower: tuple = option(Spec("--lower-is-better", "Declare that lower METRIC is better (repeatable).",
                               multiple=True, metavar="METRIC"))
    env: Mapping[str, str] = option(ENV_FIELDS, help="A field added to every record's eval environment (repeatable; "
                                    "lm-eval results carry their own).")
    decimals: int | None = option(DECIMALS)
    as_json: bool = option(JSON)

    def relations(self) -> list[str]:
        both = sorted(set(self.higher) & set(self.lower))
        return [f"evidence import: {both[0]} is declared both --higher-is-better and --lower-is-better"] if both else []

    @property
    def directions(self) -> dict[str, bool] | None:
        """metric -> higher is better, as the flags declare (None: none declared)."""
        return {**{m: True for m in self.higher}, **{m: False for m in self.lower}} or None


@dataclass(frozen=True)
class EvidenceExport(Request):
    """Print every record (stale ones flagged) as CSV or JSON; the CSV imports again."""

    fmt: str = option(Spec("--format", kind="choice", choices=("csv", "json"), default="csv", shown=True))
    as_json: bool = option(JSON, help="The same as --format json.")

    @property
    def format(self) -> str:
        return "json" if self.as_json else self.fmt


@dataclass(frozen=True)
class EvidenceShow(Request):
    """n, mean, std, SE, 95% CI, min, max, range per model (all, or NAMES), sub-score and eval environment.

    Records of different eval environments are never pooled. For each replicate group (replicate_of: in
    vecmerge.yaml): the variance between trainings and within evaluations, with confidence intervals.
    """

    names: tuple = argument(nargs=-1)
    metric: str | None = option(METRIC, help="Only this metric.")
    include_stale: bool = option(STALE)
    plot: str | None = option(PLOT)
    force: bool = option(FORCE)
    env: tuple = option(ENV, help="Only these eval environments.")
    by: str | None = option(Spec("--by", "One table per eval environment, with its fields.", kind="choice",
                                 choices=("env",)))
    as_json: bool = option(JSON)


@dataclass(frozen=True)
class Ls(Request):
    """The workspace: name, path, sha256, base model, parent, runs recorded and their mean."""

    metric: str | None = option(METRIC, help="The metric for runs and mean (default: metric: in vecmerge.yaml).")
    as_json: bool = option(JSON)


@dataclass(frozen=True)
class Gate(Request):
    """Is BASE + alpha*(X - Y) worth trying? Seven conditions, PASS/FAIL/UNKNOWN; exit 0 only when all pass.

    Common base, common parent (lineage), stable backbone (repeated runs), repeated evidence (X beats Y
    beyond eval noise, or the decision of a plan of X vs Y), module consensus, small trust region, no
    sub-score regresses (each protected sub-score of X not worse than Y's at its margin). Thresholds, protect
    and margin: gate: in vecmerge.yaml.
    """

    base: str = option(Spec("--base", "The backbone, e.g. v54.", required=True))
    direction: str = option(Spec("--dir", "The direction X - Y, e.g. 'v51 - v28'.", required=True))
    consensus_ref: str | None = option(Spec("--consensus-ref", "The reference trajectory for module consensus, "
                                            "e.g. 'v54 - v54e2'."))
    trust: float | None = option(Spec("--trust", "The relative step T of the planned merge.", kind="float",
                                      check=positive("--trust", "a relative step > 0, e.g. 0.0113")))
    metric: str | None = option(METRIC, help="The ledger metric (default: gate.metric or metric: in vecmerge.yaml).")
    env: tuple = option(ENV)
    as_json: bool = option(JSON)
