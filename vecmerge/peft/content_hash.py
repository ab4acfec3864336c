"""An adapter's content hash: what the evidence ledger ties a score to (the weights and the config together).

``content_sha256 = sha256("weights <hex>\nconfig <hex>\n")`` over the sha256 of the weights file and of
``adapter_config.json``: other weights, or the same weights under another config (scale, targets), give
another hash. ``folder_content_sha256`` computes it from the files alone, for adapters vecmerge would not
merge (DoRA, modules_to_save) whose scores the ledger may still keep.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from ..errors import AdapterError
from ..io.files import check_regular
from ..io.hashing import sha256_file
from .format import BIN_NAME, CONFIG_NAME, SAFETENSORS_NAME


def content_sha256(weights_sha256: str, config_sha256: str) -> str:
    """The content hash of an adapter: what the evidence ledger ties a score to.

    ``sha256("weights <hex>\nconfig <hex>\n")`` over the sha256 of the weights file and of
    ``adapter_config.json``: other weights, or the same weights under another config (scale, targets),
    give another hash.
    """
    return hashlib.sha256(f"weights {weights_sha256}\nconfig {config_sha256}\n".encode()).hexdigest()


def weights_file(folder: Path) -> Path | None:
    """The adapter's weights file in ``folder`` (safetensors first, as PEFT loads it), or None."""
    for name in (SAFETENSORS_NAME, BIN_NAME):
        check_regular(Path(folder) / name)  # a FIFO is refused, never taken as missing
        if (Path(folder) / name).is_file():
            return Path(folder) / name
    return None


def folder_content_sha256(folder) -> str:
    """``content_sha256`` of an adapter folder, read from its files without validating the LoRA.

    Equal to ``Adapter(folder).content_sha256``; works for adapters vecmerge refuses to merge (DoRA,
    modules_to_save), whose scores the ledger may still keep. Raises AdapterError when the config or
    the weights file is missing.
    """
    folder = Path(folder)
    weights = weights_file(folder)
    if not (folder / CONFIG_NAME).is_file() or weights is None:
        what = CONFIG_NAME if not (folder / CONFIG_NAME).is_file() else f"{SAFETENSORS_NAME} or {BIN_NAME}"
        raise AdapterError(f"{folder}: no {what}, so its content sha256 (what evidence is tied to) cannot be "
                           "computed; fix the path in vecmerge.yaml")
    return content_sha256(sha256_file(weights), sha256_file(folder / CONFIG_NAME))
