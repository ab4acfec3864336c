"""Run the demo and paste its transcript into README.md between the demo-output markers (`make readme`).

The README's example output is never edited by hand: tests/test_demo.py checks that the pasted
transcript still matches what the demo prints (numbers masked, since training round-off may differ
between machines; sha256 lines masked too).
"""

import io
import sys
import tempfile
from pathlib import Path

from vecmerge.demo import run_demo

ROOT = Path(__file__).resolve().parents[1]
START, END = "<!-- demo-output:start -->", "<!-- demo-output:end -->"


def transcript(out: Path) -> str:
    buf = io.StringIO()
    run_demo(out, force=True, quiet=True, echo=lambda s: print(s, file=buf))
    return buf.getvalue().replace(str(out), "demo-out")


def paste(readme: str, text: str) -> str:
    head, rest = readme.split(START, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{START}\n```text\n$ make demo\n{text.rstrip()}\n```\n{END}{tail}"


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        text = transcript(Path(tmp) / "demo-out")
    readme = ROOT / "README.md"
    readme.write_text(paste(readme.read_text(), text))
    print(f"updated {readme}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
