"""Paste real transcripts into the docs (`make readme`): never edit example output by hand.

- docs/GUIDE.md, between the demo-output markers: what `make demo` prints; between the evidence-example and
  evidence-plan-example markers: the evidence commands on the user's published scores (``EVIDENCE``).
- examples/WALKTHROUGH.md, between the walkthrough-output markers: what examples/walkthrough.py prints
  in that demo folder.
- docs/ARCHITECTURE.md, between the import-picture markers: the packages' imports (tools/import_picture.py).
- docs/RECIPES.md: the recipe keys (``vecmerge.recipe.docs.recipe_markdown``), the same as ``vecmerge run --help``.

tests/demo/test_run.py checks that the pasted GUIDE transcript still matches a demo run (numbers masked,
since training round-off may differ between machines; hashes masked too).
"""

import io
import os
import shlex
import shutil
import sys
import tempfile
from pathlib import Path

from vecmerge.demo.run import run_demo

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))

from walkthrough import run_walkthrough  # noqa: E402

sys.path.insert(0, str(ROOT / "tools"))
import import_picture  # noqa: E402


def paste(doc: Path, name: str, text: str, header: str = "") -> None:
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    head, rest = doc.read_text().split(start, 1)
    _, tail = rest.split(end, 1)
    doc.write_text(f"{head}{start}\n```text\n{header}{text.strip()}\n```\n{end}{tail}")
    print(f"updated {doc}", file=sys.stderr)


EVIDENCE = {  # GUIDE block -> the commands, run in a fresh folder holding examples/evidence/*.csv
    "evidence-example": ["evidence import scores.csv --higher-is-better official_total",
                         "evidence show --metric official_total", "evidence compare v51 v28"],
    "evidence-plan-example": ["evidence import history.csv --higher-is-better official_total",
                              "evidence plan v51 --vs v28 --metric official_total --min-effect 0.01 --max-runs 10",
                              "evidence import scores.csv", "evidence decide v51 --vs v28 --replay"],
}


def evidence_transcript(commands: list[str]) -> str:
    """``$ vecmerge COMMAND`` and its output, for each command, in a fresh folder with the example CSVs."""
    from click.testing import CliRunner

    from vecmerge.cli import main as cli

    old = os.getcwd()
    with tempfile.TemporaryDirectory() as tmp:
        for csv in (ROOT / "examples" / "evidence").glob("*.csv"):
            shutil.copy(csv, tmp)
        os.chdir(tmp)
        try:
            chunks = []
            for command in commands:
                res = CliRunner().invoke(cli, ["--quiet", *shlex.split(command)], catch_exceptions=False)
                if res.exit_code:
                    raise SystemExit(f"vecmerge {command}: exit {res.exit_code}\n{res.output}")
                chunks.append(f"$ vecmerge {command}\n{res.stdout.rstrip()}")
        finally:
            os.chdir(old)
    return "\n\n".join(chunks)


def main() -> int:
    from vecmerge.recipe.docs import recipe_markdown

    for block, commands in EVIDENCE.items():
        paste(ROOT / "docs" / "GUIDE.md", block, evidence_transcript(commands))

    import_picture.paste(import_picture.picture())
    (ROOT / "docs" / "RECIPES.md").write_text(recipe_markdown())
    print(f"updated {ROOT / 'docs' / 'RECIPES.md'}", file=sys.stderr)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "demo-out"
        buf = io.StringIO()
        run_demo(out, force=True, quiet=True, echo=lambda s: print(s, file=buf))
        paste(ROOT / "docs" / "GUIDE.md", "demo-output", buf.getvalue().replace(str(out), "demo-out"), "$ make demo\n")
        buf = io.StringIO()
        run_walkthrough(out, echo=lambda s: print(s, file=buf))
        text = buf.getvalue().replace(str(out.resolve()), "demo-out").replace(str(out), "demo-out")
        paste(ROOT / "examples" / "WALKTHROUGH.md", "walkthrough-output", text, "$ cd demo-out\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
