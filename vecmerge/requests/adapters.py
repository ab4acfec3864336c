"""The inputs of ``vecmerge inspect``, ``audit`` and ``verify``, one request each.

Each class's docstring is its command's ``--help``; each field is one option (``spec.option``).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..options import (
    AUDIT_SORT_HELP,
    AUDIT_SORTS,
    AUDIT_VIEW_HELP,
    AUDIT_VIEWS,
    MODULES_TO_SAVE,
    REPORT_FORMAT_HELP,
    REPORT_FORMATS,
)
from ..recipe.keys import KEY
from .shared import FORCE, JSON, PLOT
from .spec import Request, Spec, argument, option


@dataclass(frozen=True)
class Inspect(Request):
    """Config, scale rule, ranks, dtype, norms and sha256 of each ADAPTER (name or folder).

    DoRA adapters need --base-model; lora_bias adapters also show the norm of their bias updates.
    """

    adapters: tuple = argument(nargs=-1, required=True)
    base_model: str | None = option(Spec(
        "--base-model", "A local base model folder (transformers, safetensors): DoRA adapters are described by their "
        "effective update m * (W + sBA) / ||W + sBA|| - W against its weights (needed for DoRA; default the "
        "workspace's base_model).", kind="path", path={"file_okay": False}))
    as_json: bool = option(JSON)


@dataclass(frozen=True)
class Audit(Request):
    """Per-module sign consensus and cosine: --ref EXPR --dir EXPR, or pairwise over ADAPTERS."""

    adapters: tuple = argument(nargs=-1)
    ref: str | None = option(Spec("--ref", "Reference trajectory expression, e.g. 'v54 - v54e2'."))
    direction: str | None = option(Spec("--dir", "Direction expression, e.g. 'v51 - v28'."))
    by: str = option(Spec("--by", AUDIT_VIEW_HELP, kind="choice", choices=AUDIT_VIEWS, default="module", shown=True))
    sort: str = option(Spec("--sort", AUDIT_SORT_HELP, kind="choice", choices=AUDIT_SORTS, default="module",
                            shown=True))
    fmt: str = option(Spec("--format", REPORT_FORMAT_HELP, kind="choice", choices=REPORT_FORMATS, default="table",
                           shown=True))
    as_json: bool = option(JSON, help="Machine-readable output: the same as --format json.")
    plot: str | None = option(PLOT, help="Also write a cosine heatmap PNG, layers x module types (needs matplotlib).")
    force: bool = option(FORCE)
    allow_missing: bool = option(Spec("--allow-missing", KEY["allow_missing"].describe() + " Audits count them "
                                      "apart (not compared).", kind="flag"))
    samples: int = option(Spec("--samples", "Random rotations per module for the chance band; 0 for the analytic "
                               "band 1.96/sqrt(out*in).", kind="int", default=200, shown=True,
                               check=lambda v: None if v >= 0 else f"--samples {v}: give 0 (analytic band) or a "
                               "positive number of draws"))
    modules_to_save: str = option(Spec("--modules-to-save", KEY["modules_to_save"].describe(), kind="choice",
                                       choices=MODULES_TO_SAVE, default="refuse", shown=True))
    allow_base_mismatch: bool = option(Spec("--allow-base-mismatch", KEY["allow_base_mismatch"].describe(),
                                            kind="flag"))

    def relations(self) -> list[str]:
        """A second format, then the one problem with what is audited (--ref/--dir or ADAPTERS)."""
        out = []
        if self.as_json and self.fmt not in ("table", "json"):
            out.append(f"audit: --json and --format {self.fmt} ask for two formats; give one")
        if (self.ref is None) != (self.direction is None):
            given, lacking = ("--ref", "--dir") if self.ref is not None else ("--dir", "--ref")
            out.append(f"audit: {given} needs {lacking} too; e.g. --ref 'v54 - v54e2' --dir 'v51 - v28'")
        elif self.ref is not None and self.adapters:
            out.append("audit: give either --ref/--dir or ADAPTERS for a pairwise matrix, not both")
        elif self.ref is None and len(self.adapters) < 2:
            what = f"only one adapter ({self.adapters[0]})" if self.adapters else "nothing to audit"
            out.append(f"audit: {what}; pass --ref EXPR --dir EXPR, or two or more ADAPTERS to compare")
        return out

    @property
    def format(self) -> str:
        """table | json | csv | markdown (``--json``: json)."""
        return "json" if self.as_json else self.fmt


@dataclass(frozen=True)
class Verify(Request):
    """Re-derive an output from its manifest and check every identity; exit 1 if any check fails."""

    target: tuple = argument(nargs=-1, required=True)
    base_model: str | None = option(Spec(
        "--base-model", "Local transformers model folder (config.json and weights) of the model the output "
        "declares: load through PEFT and compare deltas, logits and merge_and_unload (default: the workspace's "
        "base_model).", kind="path", path={"exists": True, "file_okay": False}))
    allow_base_mismatch: bool = option(Spec("--allow-base-mismatch", "Run the PEFT checks even when --base-model is "
                                            "not the model the output declares.", kind="flag"))
    identities: bool = option(Spec("--identities", "Check algebraic identities of TARGET adapters (no manifest).",
                                   kind="flag"))
    as_json: bool = option(JSON, help="Machine-readable report.")

    def relations(self) -> list[str]:
        if self.identities and self.base_model:
            return ["verify: --base-model needs an output folder with a manifest; drop it with --identities"]
        if not self.identities and len(self.target) != 1:
            return ["verify takes one output folder (or --identities ADAPTER...)"]
        return []
