"""The inputs of ``vecmerge search``, one request (its docstring is the command's ``--help``)."""

from __future__ import annotations

from dataclasses import dataclass

from .shared import BASE_MODEL, FORCE, JSON, RECIPE
from .spec import Problem, RecipeFile, Request, Spec, at_least, option


def named_files(flag: str):
    """A parser: repeated ``NAME=PROMPTS`` -> ``{name: file}``; a problem for a malformed or repeated name."""
    def parse(values: tuple[str, ...]) -> dict[str, str]:
        out: dict[str, str] = {}
        for v in values:
            name, eq, rest = v.partition("=")
            if not eq or not name.strip() or not rest.strip():
                raise Problem(f"{flag} {v!r}: give NAME=PROMPTS")
            if name.strip() in out:
                raise Problem(f"{flag} {name.strip()}: given twice; name each set once")
            out[name.strip()] = rest.strip()
        return out

    return parse


def _number(text: str, what: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise Problem(what) from None


def margins(values: tuple[str, ...]) -> float | dict[str, float]:
    """``--margin M`` (one for all) or ``--margin NAME=M`` per protected set."""
    if len(values) == 1 and "=" not in values[0]:
        return _number(values[0], f"--margin {values[0]!r}: give a number (a loglik drop in nats, >= 0) or NAME=M")
    return {n: _number(t, f"--margin {n}={t!r}: give a number") for n, t in named_files("--margin")(values).items()}


def energy_list(text: str) -> list[float]:
    """``0,0.9,0.99`` -> the energies (0: no protection)."""
    try:
        return [float(x) for x in text.split(",")]
    except ValueError:
        raise Problem(f"--energies {text!r}: give numbers separated by commas, e.g. 0,0.9,0.99") from None


def _files(flag: str, help: str, **more) -> Spec:
    return Spec(flag, help, multiple=True, metavar="NAME=PROMPTS", parse=named_files(flag), files=True, **more)


@dataclass(frozen=True)
class Search(Request):
    """Search steps from BASE along the directions that raise TARGET's loglik while every PROTECT set stays
    within its margin; write the top candidates.

    Each candidate (coefficients, trust, protection energy, optional depth schedule, attention/MLP mix,
    module exclusions) is the backbone plus exact factored terms, scored through probe's hooks with nothing
    written; every evaluation goes into the ledger under the candidate's recipe hash.
    """

    recipe: RecipeFile | None = option(RECIPE, help="A YAML file of the options below, keyed by their words "
                                       "(trust_max: 0.5, dir: [EXPR], target: {NAME: FILE}), its paths from its "
                                       "folder; a flag typed beside it replaces that key (docs/SEARCH.md).")
    base: str = option(Spec("--base", "The backbone expression (the adapter you step from).", required=True))
    dirs: tuple[str, ...] = option(Spec("--dir", "A direction expression (repeatable), e.g. 't0 - bb'.",
                                        multiple=True, required=True))
    target: dict = option(_files("--target", "The prompt set whose mean loglik change is maximised (probe's JSON "
                                             "Lines).", required=True))
    protect: dict = option(_files("--protect", "A prompt set that must not regress (repeatable); also the "
                                               "protection's inputs.", required=True))
    margin: float | dict = option(Spec("--margin", "The drop allowed per protected set (nats per item): its lower "
                                                   "95% bound >= -M.", multiple=True, required=True,
                                       metavar="M|NAME=M", parse=margins))
    trust_max: float = option(Spec("--trust-max", "The largest step, relative to the backbone's norm.",
                                   kind="float", required=True))
    budget: int = option(Spec("--budget", "Candidates to evaluate.", kind="int", default=40, shown=True,
                              check=at_least("--budget", 1, "evaluate at least 1 candidate")))
    seed: int = option(Spec("--seed", "The sampler's seed (same seed, same candidates).", kind="int", default=0,
                            shown=True))
    sampler: str = option(Spec("--sampler", "grid (no extra), tpe (optuna's constrained TPE; pip install "
                                            "'vecmerge[search]'), auto: tpe if installed.", kind="choice",
                               choices=("auto", "grid", "tpe"), default="auto", shown=True))
    top_k: int = option(Spec("--top", "Candidates written as PEFT LoRAs.", kind="int", default=3, shown=True,
                             check=at_least("--top", 1, "write at least 1 candidate")))
    depth: bool = option(Spec("--depth", "Search a depth schedule too (a dose growing or shrinking with the layer).",
                              kind="flag"))
    types: bool = option(Spec("--types", "Search the attention/MLP mix too.", kind="flag"))
    exclude: tuple[str, ...] = option(Spec("--exclude-choice", "Module patterns a candidate may leave out "
                                                               "(repeatable; each a yes/no in the space).",
                                           multiple=True, metavar="REGEX"))
    energies: list | None = option(Spec("--energies", "Protection energies to search, 0 = none (default "
                                                      "0,0.5,0.9,0.99).", parse=energy_list))
    base_model: str | None = option(BASE_MODEL, help="The base model folder (default: the workspace's).")
    batch: int = option(Spec("--batch", "Items per forward pass.", kind="int", default=8, shown=True,
                             check=at_least("--batch", 1, "at least 1 item per forward pass")))
    workers: int = option(Spec("--workers", "Score candidates on N Ray workers (one per GPU of the cluster; "
                                            "without GPUs N CPU workers); 0: in this process. pip install "
                                            "'vecmerge[ray]'.", kind="int", default=0, shown=True,
                                check=at_least("--workers", 0, "give 0 (this process) or more workers")))
    out_dir: str = option(Spec("--out-dir", "Where search.json, front.png and top1..topK go.", kind="path",
                               path={"file_okay": False}, required=True))
    resume: bool = option(Spec("--resume", "Continue a search the ledger holds (its evaluations are replayed).",
                               kind="flag"))
    force: bool = option(FORCE, help="Replace outputs vecmerge wrote.")
    as_json: bool = option(JSON)
