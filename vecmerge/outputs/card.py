"""The model card (``README.md``) every output folder carries: Hugging Face front matter and a body.

The front matter is ``library_name: peft``, the base model when it is a hub id, and the tags; each writer
(``pipeline.manifest``, ``models.extract_write``, ``models.fuse``) gives the title and the body it
builds from its manifest.
"""

from __future__ import annotations

import json
import re

CARD_NAME = "README.md"
_YAML_WORDS = {"true", "false", "yes", "no", "on", "off", "null", "y", "n", "~"}


def model_card(base_model: str | None, title: str, body: str) -> str:
    """A Hugging Face model card with ``library_name: peft`` front matter.

    ``base_model`` comes from an input's config (a stranger's text): anything but a plain model id is
    written as a quoted YAML string, so a newline cannot add keys to the front matter; the title is
    kept on one line.
    """
    front = ["---", "library_name: peft"]
    if base_model:
        front.append(f"base_model: {yaml_scalar(base_model)}")
    front += ["tags:", "- lora", "- vecmerge", "---", ""]
    title = re.sub(r"[\x00-\x1f\x7f]+", " ", title)
    return "\n".join(front) + f"# {title}\n\n{body.rstrip()}\n"


def yaml_scalar(text: str) -> str:
    """``text`` as YAML: plain when it is a simple id (``Qwen/Qwen3-0.6B``), else a double-quoted string.

    JSON's string syntax is YAML's double-quoted style, with every control character and quote escaped.
    """
    plain = re.fullmatch(r"[A-Za-z0-9_./][A-Za-z0-9_./+=@-]*", text)
    if plain and text.lower() not in _YAML_WORDS and not re.fullmatch(r"[0-9._+eE-]+", text):
        return text
    return json.dumps(text)
