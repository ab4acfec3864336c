"""docs/ARCHITECTURE.md's import picture is the code's (tools/import_picture.py draws it; `make readme` pastes it)."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

import import_picture  # noqa: E402


def test_the_pasted_import_picture_is_drawn_from_the_code():
    doc = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    pasted = doc.split(import_picture.START)[1].split(import_picture.END)[0].strip()
    assert pasted == import_picture.picture(), "run `make readme` to paste the current picture"


def test_the_picture_shows_the_layers_of_the_code():
    graph = import_picture.edges()
    assert "click" not in str(graph)  # packages of vecmerge only
    assert graph["io"] <= {"errors"} and "cli" not in set().union(*graph.values())  # nothing imports the CLI
