"""Paste real transcripts into the docs (`make readme`): never edit example output by hand.

- README.md, between the demo-output markers: what `make demo` prints.
- examples/WALKTHROUGH.md, between the walkthrough-output markers: what examples/walkthrough.py prints
  in that demo folder.
- docs/RECIPES.md: the recipe keys (``vecmerge.recipe.docs.recipe_markdown``), the same as ``vecmerge run --help``.

tests/demo/test_run.py checks that the pasted README transcript still matches a demo run (numbers masked,
since training round-off may differ between machines; hashes masked too).
"""

import io
import sys
import tempfile
from pathlib import Path

from vecmerge.demo.run import run_demo

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))

from walkthrough import run_walkthrough  # noqa: E402


def paste(doc: Path, name: str, text: str, header: str = "") -> None:
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    head, rest = doc.read_text().split(start, 1)
    _, tail = rest.split(end, 1)
    doc.write_text(f"{head}{start}\n```text\n{header}{text.strip()}\n```\n{end}{tail}")
    print(f"updated {doc}", file=sys.stderr)


def main() -> int:
    from vecmerge.recipe.docs import recipe_markdown

    (ROOT / "docs" / "RECIPES.md").write_text(recipe_markdown())
    print(f"updated {ROOT / 'docs' / 'RECIPES.md'}", file=sys.stderr)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "demo-out"
        buf = io.StringIO()
        run_demo(out, force=True, quiet=True, echo=lambda s: print(s, file=buf))
        paste(ROOT / "README.md", "demo-output", buf.getvalue().replace(str(out), "demo-out"), "$ make demo\n")
        buf = io.StringIO()
        run_walkthrough(out, echo=lambda s: print(s, file=buf))
        text = buf.getvalue().replace(str(out.resolve()), "demo-out").replace(str(out), "demo-out")
        paste(ROOT / "examples" / "WALKTHROUGH.md", "walkthrough-output", text, "$ cd demo-out\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
