"""The inputs of ``vecmerge extract``, ``fuse``, ``probe`` and ``demo``, one request each.

Each class's docstring is its command's ``--help``; each field is one option (``spec.option``).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..options import (
    DTYPE_NAMES,
    EXTRACT_OTHERS,
    EXTRACT_OTHERS_HELP,
    EXTRACT_RANK_HELP,
    EXTRACT_TARGETS_HELP,
    FUSE_DTYPE_HELP,
    is_hub_id,
)
from .shared import BASE_MODEL, FORCE, JSON, OUT_FOLDER, PLOT
from .spec import Request, Spec, argument, option

MANIFEST = JSON.with_help("Print the manifest instead of the report.")
REPLACE_OUT = FORCE.with_help("Replace an existing --out that vecmerge wrote.")


@dataclass(frozen=True)
class Extract(Request):
    """A LoRA from a full fine-tune: each module's difference cut at --rank, with its exact error."""

    base_model: str = option(BASE_MODEL, help="The base model folder.", required=True)
    tuned: str = option(Spec("--tuned", "The fully fine-tuned model folder.", kind="path", path={"file_okay": False},
                             required=True))
    rank: str = option(Spec("--rank", EXTRACT_RANK_HELP + ".", required=True))
    targets: str = option(Spec("--targets", EXTRACT_TARGETS_HELP + ".", default="all-linear", shown=True))
    others: str | None = option(Spec("--others", EXTRACT_OTHERS_HELP + ".", kind="choice", choices=EXTRACT_OTHERS))
    dtype: str = option(Spec("--dtype", "dtype of the written factors.", kind="choice", choices=DTYPE_NAMES,
                             default="fp32", shown=True))
    seed: int = option(Spec("--seed", "Seed of the randomized range finder.", kind="int", default=0, shown=True))
    base_model_id: str | None = option(Spec(
        "--base-model-id", "Hub id of the base model (ORG/NAME), written as base_model_name_or_path and in the model "
        "card (default: base_model_id in vecmerge.yaml when its base_model is --base-model, else the local folder).",
        check=lambda v: None if v is None or is_hub_id(v) else f"--base-model-id {v!r}: a hub id such as "
        "Qwen/Qwen3-0.6B (ORG/NAME)"))
    out: str = option(OUT_FOLDER)
    force: bool = option(REPLACE_OUT)
    as_json: bool = option(MANIFEST)
    show_modules: bool = option(Spec("--modules", "Also print the per-module table.", kind="flag"))

    @property
    def target_list(self) -> list[str]:
        """``--targets`` split at its commas (empty names left out)."""
        return [t for t in self.targets.split(",") if t.strip()]


@dataclass(frozen=True)
class Fuse(Request):
    """ADAPTER (a workspace name or a folder) added into the base model's weights, written as a plain sharded
    safetensors model."""

    adapter: str = argument(required=True, kind="path", path={"file_okay": False})
    base_model: str | None = option(BASE_MODEL)
    out: str = option(OUT_FOLDER, help="Output model folder.")
    dtype: str | None = option(Spec("--dtype", FUSE_DTYPE_HELP + ".", kind="choice", choices=DTYPE_NAMES))
    force: bool = option(REPLACE_OUT)
    as_json: bool = option(MANIFEST)


@dataclass(frozen=True)
class Probe(Request):
    """Teacher-force each adapter on PROMPTS: loglik, exact, first-token rank per item; KL/JS per pair.

    The base is loaded once (float32, --device); each adapter's exact update s*B@A is added by hooks, so the
    outputs equal a PEFT-loaded model's and the base is never changed. Results go into the ledger tied to each
    adapter's sha256 and the prompt file's; a re-run computes only what is missing.
    """

    names: tuple = argument(nargs=-1, required=True)
    prompts: str = option(Spec("--prompts", "JSON Lines: id, prompt or prompt_ids, target or target_ids, optional "
                               "task and cluster.", kind="path", path={"dir_okay": False}, required=True))
    base_model: str | None = option(BASE_MODEL, help="The base model folder (default: base_model in vecmerge.yaml); "
                                    "its tokenizer encodes text.")
    batch: int = option(Spec("--batch", "Items per forward pass.", kind="int", default=8, shown=True,
                             check=lambda v: None if v >= 1 else f"--batch {v}: at least 1 item per forward pass"))
    name: str | None = option(Spec("--name", "The metrics' stem, probe:NAME:loglik (default: the prompt file's "
                                   "name)."))
    pairs: bool = option(Spec("--pairs/--no-pairs", "KL and JS between every pair of adapters (each pair needs both "
                              "forward passes).", kind="pair", default=True, shown=True))
    record: bool = option(Spec("--record/--no-record", "Write into the ledger, and reuse what it holds (--no-record: "
                               "compute everything, write nothing).", kind="pair", default=True, shown=True))
    plot: str | None = option(PLOT, help="A PNG: the 2-D map and the distance heatmap.")
    force: bool = option(FORCE)
    as_json: bool = option(JSON)

    def relations(self) -> list[str]:
        if len(set(self.names)) != len(self.names):
            return [f"probe: name each adapter once (got {' '.join(self.names)})"]
        return []


@dataclass(frozen=True)
class Demo(Request):
    """Train toy trajectories, then inspect, audit, project and verify: the whole story in a minute."""

    out: str = option(Spec("--out", "The demo folder (the toy checkpoints, vecmerge.yaml, the audit plot and "
                           "out/v58).", kind="path", path={"file_okay": False}, default="demo-out", shown=True))
    force: bool = option(Spec("--force", "Replace an existing --out (only one a demo made).", kind="flag"))
    small: bool = option(Spec("--small", "Smallest settings (for tests).", kind="flag"))
