"""The options several commands share, declared once: ``--metric``, ``--env``, ``--json``, ``--stale``, ...

A command that words one for itself takes ``Spec.with_help``; the flag, type and parsing stay here. The
global options (``--workspace``, ``--debug``, ``--quiet``, ``--device``) are the group's (``cli/app.py``).
"""

from __future__ import annotations

from .spec import Problem, Spec, at_least

METRIC = Spec("--metric", "The metric (default: metric: in vecmerge.yaml).")
JSON = Spec("--json", "Machine-readable output.", kind="flag", in_file=False)
STALE = Spec("--stale", "Include records of weights a name no longer has.", kind="flag")
FORCE = Spec("--force", "Replace an existing --plot PNG.", kind="flag", in_file=False)
PLOT = Spec("--plot", "Write a PNG of the means with error bars.", kind="path", path={"dir_okay": False})
BASE_MODEL = Spec("--base-model", "The base model folder (default: the workspace's base_model).", kind="path",
                  path={"file_okay": False})
OUT_FOLDER = Spec("--out", "Output adapter folder.", kind="path", path={"file_okay": False}, required=True)
ENV = Spec("--env", "The eval environment: an id (as show --by env prints it) or KEY=VALUE of its fields "
           "(repeatable); needed when the records were made under several.", multiple=True, metavar="ID|KEY=VALUE")
VS = Spec("--vs", "The model A is compared with (B).", required=True)
DECIMALS = Spec("--decimals", "The decimals the scores are written with (default: counted in the text given; a "
                "grade is reported only at a known precision).", kind="int", range=(0, 20))
RECIPE = Spec("--recipe", "A YAML file of the other options, keyed by their words (out_dir: DIR), its paths from "
              "its folder; a flag typed beside it replaces that key.", kind="recipe", metavar="FILE.yaml",
              in_file=False)
MIN_MODELS = Spec("--min-models", "Models needed before a proxy may rank (default 8).", kind="int",
                  check=at_least("--min-models", 3, "at least 3 (a rank correlation needs 3 models)"))


def metric_list(flag: str):
    """A parser: ``P1,P2`` -> ``("P1", "P2")``; a problem for an empty name or a repeated one."""
    def parse(text: str) -> tuple[str, ...]:
        names = [p.strip() for p in text.split(",")]
        if not all(names) or len(set(names)) != len(names):
            raise Problem(f"{flag} {text!r}: give metric names separated by commas, each once")
        return tuple(names)

    return parse


PROXY = Spec("--proxy", required=True, parse=metric_list("--proxy"))
