"""The main job: the demo runs end to end (small settings) and its verify passes; README stays true."""

import json
import re
from pathlib import Path

import pytest

from vecmerge.demo import prepare_folder, run_demo
from vecmerge.errors import OutputError

ROOT = Path(__file__).resolve().parents[1]


def mask(text: str) -> str:
    """Numbers and hashes vary with training round-off across machines; the words and layout must not."""
    text = re.sub(r"\b[0-9a-f]{16,64}\b", "<hash>", text)
    text = re.sub(r"[-+]?\d+(\.\d+)?(e[-+]?\d+)?", "<n>", text)
    return "\n".join(re.sub(r"\s+", " ", line).strip() for line in text.splitlines())


@pytest.fixture(scope="module")
def small_demo(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo") / "demo-out"
    lines = []
    result = run_demo(out, small=True, quiet=True, echo=lines.append)
    return out, "\n".join(lines), result


@pytest.mark.slow
def test_demo_runs_end_to_end(small_demo):
    out, text, result = small_demo
    for cmd in ("$ vecmerge inspect v54 v51", "$ vecmerge audit --ref v54-v54e2", "$ vecmerge project --base v54",
                "$ vecmerge verify out/v58 --base-model base"):
        assert cmd in text
    assert re.search(r"(\d+)/\1 modules agree", text), text  # the consensus line, all agreeing
    assert (out / "audit.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    man = json.loads((out / "out" / "v58" / "vecmerge.json").read_text())
    assert man["output"]["sha256"] == result["sha256"] and result["sha256"] in text
    assert man["resolved"]["realized"]["global"] == pytest.approx(0.0113, rel=1e-12)
    assert "uploadable adapter:" in text


def test_demo_refuses_foreign_folders(tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "thesis.tex").write_text("precious")
    with pytest.raises(OutputError, match="already exists; pass --force"):
        prepare_folder(tmp_path / "mine", force=False)
    with pytest.raises(OutputError, match="--force replaces only a folder vecmerge wrote"):
        prepare_folder(tmp_path / "mine", force=True)
    assert (tmp_path / "mine" / "thesis.tex").read_text() == "precious"


@pytest.mark.slow
def test_readme_transcript_matches_the_demo(small_demo):
    """The README's pasted transcript has the same commands, words and table layout as a demo run."""
    readme = (ROOT / "README.md").read_text()
    block = readme.split("<!-- demo-output:start -->")[1].split("<!-- demo-output:end -->")[0]
    pasted = block.split("```text\n$ make demo\n", 1)[1].rsplit("```", 1)[0]
    commands = [line for line in pasted.splitlines() if line.startswith("$ vecmerge")]
    out, text, _ = small_demo
    text = text.replace(str(out), "demo-out")
    assert commands == [line for line in text.splitlines() if line.startswith("$ vecmerge")]
    # the small demo has fewer layers, so compare the parts whose shape does not depend on size
    want = [line for line in mask(pasted).splitlines() if line.startswith(("$", "consensus", "uploadable"))]
    got = [line for line in mask(text).splitlines() if line.startswith(("$", "consensus", "uploadable"))]
    assert want == got


@pytest.mark.slow
def test_walkthrough_runs_in_the_demo_folder(small_demo):
    import sys

    sys.path.insert(0, str(ROOT / "examples"))
    from walkthrough import run_walkthrough

    out, _, _ = small_demo
    lines = []
    run_walkthrough(out, echo=lines.append)
    text = "\n".join(lines)
    for name in ("v58", "v59", "v60", "ladder-x1.456"):
        assert (out / "out" / name / "vecmerge.json").is_file()
    assert re.search(r"clipped by trust\s+yes", text)
    assert "7/7 module(s) disagree" in text and "(exit 1)" in text
    assert not (out / "out" / "wrong-way").exists()
    assert "Traceback" not in text
