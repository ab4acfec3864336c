"""verify_manifest: every file of an output and every manifest field accounted for, each difference named.

The references are the rules of the module docstring written out by hand: mappings with the same keys, lists of
the same length, numbers within rtol (FIGURES_RTOL 1e-6 by default; integers exactly; NaN never), the rest exactly.
"""

import hashlib
import json
import math
import os
from pathlib import Path

import pytest

from vecmerge.io.parse import short
from vecmerge.outputs.manifest import shape_problems
from vecmerge.verify.checks.files import FIGURES_RTOL, differences, figures_check, files_check
from vecmerge.verify.checks.output import verify_output


def test_differences_names_each_place_that_differs():
    want = {"a": 1, "b": [1.0, 2.0], "c": {"d": "x"}, "model.layers.0.q": {"rank": 4}}
    got = {"a": 2, "b": [1.0, 2.5], "c": {"d": "y", "e": 1}, "model.layers.0.q": {}, "z": 0}
    assert differences(want, got, "figures") == [
        "figures.z is not a field vecmerge writes",
        "figures.a is 2, recomputes to 1",
        "figures.b[1] is 2.5, recomputes to 2.0",
        "figures.c.e is not a field vecmerge writes",
        "figures.c.d is 'y', recomputes to 'x'",
        "figures[model.layers.0.q].rank is missing",
    ]
    assert differences({"a": 1}, {}, "m") == ["m.a is missing"]
    assert differences({"a": 1}, 3, "m") == ["m is 3, recomputes to a mapping"]
    assert differences([1, 2], [1], "m") == ["m is [1], recomputes to [1, 2]"]
    assert differences([1, 2], "12", "m") == ["m is '12', recomputes to [1, 2]"]


def test_differences_compares_numbers_within_rtol_integers_exactly_and_types_strictly():
    assert FIGURES_RTOL == 1e-6
    assert differences(1.0, 1.0 + 5e-7, "x") == [] and differences(1.0, 1.0 + 2e-6, "x") == ["x is 1.000002, "
                                                                                                "recomputes to 1.0"]
    assert differences(1.0, 1.0 + 5e-7, "x", rtol=1e-9) == ["x is 1.0000005, recomputes to 1.0"]
    assert differences(3, 3, "x") == [] and differences(3, 4, "x") == ["x is 4, recomputes to 3"]
    assert differences(3, 3.0000001, "x") == []          # an int recorded as a float compares by value
    assert differences(1, True, "x") == ["x is True, recomputes to 1"]
    assert differences(True, 1, "x") == ["x is 1, recomputes to True"]
    assert differences(None, 0, "x") == ["x is 0, recomputes to None"]
    assert differences("a", "a", "x") == [] and differences(2.0, "2.0", "x") == ["x is '2.0', recomputes to 2.0"]
    assert differences(math.nan, math.nan, "x") == ["x is nan, recomputes to nan"]


@pytest.mark.parametrize("manifest, problems", [
    ([1], ["is [1], not a mapping"]),
    ({"output": {}}, ["recipe is missing"]),
    ({"recipe": 3, "output": {}}, ["recipe is 3, not a mapping"]),
    ({"recipe": {}, "output": {}, "figures": [], "modules": "x"},
     ["figures is [], not a mapping", "modules is 'x', not a mapping"]),
    ({"recipe": {"inputs": []}, "output": {}}, ["recipe.inputs is [], not a mapping"]),
    ({"recipe": {}, "output": {}, "modules": {"m": 1}, "inputs": {"v28": []}},
     ["modules['m'] is 1, not a mapping", "inputs['v28'] is [], not a mapping"]),
    ({"recipe": {"inputs": {"v28": {"sha256": 5}}}, "output": {"sha256": 7, "dtype": None}, "inputs": {
        "v51": {"config_sha256": 1}}},
     ["inputs.v51.config_sha256 is 1, not a string", "recipe.inputs.v28.sha256 is 5, not a string",
      "output.sha256 is 7, not a string", "output.dtype is None, not a string"]),
    ({"recipe": {}, "output": {}, "resolved": {"dropped": "m", "zeroed": {}, "module_alpha": [], "realized": 1}},
     ["resolved.dropped is 'm', not a list", "resolved.zeroed is {}, not a list", "resolved.module_alpha is [], "
      "not a mapping", "resolved.realized is 1, not a mapping"]),
    ({"recipe": {}, "output": {}}, []),
])
def test_shape_problems_name_every_malformed_section(manifest, problems):
    assert shape_problems(manifest) == problems


def _output(tmp_path: Path, card: bytes = b"card") -> tuple[Path, dict]:
    out = tmp_path / "out"
    out.mkdir()
    for name in ("adapter_config.json", "adapter_model.safetensors", "vecmerge.json"):
        (out / name).write_text("{}")
    (out / "README.md").write_bytes(card)
    return out, {"output": {"card_sha256": hashlib.sha256(card).hexdigest()}}


def test_files_check_names_extra_missing_linked_and_edited_files(tmp_path):
    out, man = _output(tmp_path)
    ok = files_check(out, man)
    assert ok["passed"] and ok["detail"] == ("exactly adapter_config.json, adapter_model.safetensors, vecmerge.json, "
                                             "README.md; README.md as pinned")
    assert ok["figures"] == {"extra": [], "missing": [], "card_sha256": man["output"]["card_sha256"]}
    (out / "evil.py").write_text("x")
    one = files_check(out, man)
    assert not one["passed"] and one["detail"] == (f"evil.py in {out} is not written by vecmerge (a tool loading this "
                                                   "folder may use it); remove it, or verify a fresh output")
    (out / "adapter_model.bin").write_text("x")
    assert files_check(out, man)["detail"].startswith(f"adapter_model.bin, evil.py in {out} are not written by")
    os.remove(out / "evil.py")
    os.remove(out / "adapter_model.bin")
    os.remove(out / "adapter_config.json")
    os.symlink(out / "vecmerge.json", out / "adapter_model.safetensors.tmp")
    os.remove(out / "adapter_model.safetensors")
    os.rename(out / "adapter_model.safetensors.tmp", out / "adapter_model.safetensors")
    bad = files_check(out, man)
    assert bad["detail"] == "adapter_config.json missing; adapter_model.safetensors not a regular file (a link?)"
    assert bad["figures"]["missing"] == ["adapter_config.json"]
    (out / "README.md").write_bytes(b"edited")
    got = hashlib.sha256(b"edited").hexdigest()
    pin = short(man["output"]["card_sha256"], 20)
    assert files_check(out, man)["detail"].endswith(f"; {out / 'README.md'} has sha256 {got[:16]}..., the manifest "
                                                    f"pins {pin}: the model card was edited after writing")


def test_figures_check_shows_four_differences_and_counts_the_rest():
    want = {"figures": {f"f{i}": float(i) for i in range(6)}, "modules": {"m": {"rank": 4}}}
    same = figures_check(want, want)
    assert same["passed"] and same["detail"] == "every figure of figures and modules (1) recomputes from the recipe " \
                                                "(rtol 1e-06)" and same["figures"] == {"differing": []}
    edited = {"figures": {f"f{i}": float(i) + 1 for i in range(6)}, "modules": {"m": {"rank": 4}}}
    res = figures_check(edited, want)
    lines = [f"figures.f{i} is {float(i) + 1}, recomputes to {float(i)}" for i in range(6)]
    assert not res["passed"] and res["detail"] == "; ".join(lines[:4]) + " and 2 more"
    assert res["figures"] == {"differing": lines}


# -- manifest_check through verify: every other field --------------------------------------------------
def _project(run_cli):
    res = run_cli("project", "--base", "v54", "--dir", "v51-v28", "--trust", "0.0113", "--out", "out")
    assert res.exit_code == 0, res.output
    return Path("out/vecmerge.json")


def _manifest_detail(path: Path, edit) -> dict:
    man = json.loads(path.read_text())
    edit(man)
    path.write_text(json.dumps(man))
    return {c["name"]: c for c in verify_output(path.parent)["checks"]}["manifest"]


def test_manifest_check_passes_a_clean_output_and_names_each_edited_field(toy, run_cli):
    path = _project(run_cli)
    clean = {c["name"]: c for c in verify_output("out")["checks"]}["manifest"]
    assert clean["passed"] and clean["detail"] == ("every field of vecmerge.json (resolved, missing_modules, "
                                                   "inputs, output) recomputes") and clean["figures"] == {
        "differing": []}
    original = path.read_text()

    def edited(edit):
        path.write_text(original)
        return _manifest_detail(path, edit)

    res = edited(lambda m: m.update(tool="other", kind="merge", method="ties", extra=1, created=5))
    assert not res["passed"]
    assert res["figures"]["differing"] == [
        "extra is not a field vecmerge writes", "tool is 'other', recomputes to 'vecmerge'",
        "kind is 'merge', recomputes to 'project'", "method is 'ties', recomputes to 'add'",
        "created is 5, not a string"]
    assert res["detail"] == "; ".join(res["figures"]["differing"][:4]) + " and 1 more"
    res = edited(lambda m: m.pop("vecmerge_version"))
    assert res["figures"]["differing"] == ["vecmerge_version is missing"]
    res = edited(lambda m: m["inputs"]["v28"].update(sha256="0" * 64))
    sha = json.loads(original)["inputs"]["v28"]["sha256"]
    assert res["figures"]["differing"][0] == f"inputs.v28.sha256 is {short('0' * 64, 20)}, the input's file " \
                                             f"hashes to {sha[:16]}..."
    res = edited(lambda m: m["inputs"].pop("v28"))
    assert res["figures"]["differing"] == ["inputs names v51, v54, the recipe reads v28, v51, v54"]
    res = edited(lambda m: m["output"].update(weights="x.safetensors", dtype="bf16", modules=3, sha256="abc",
                                              extra=1))
    assert res["figures"]["differing"] == [
        "output.extra is not a field vecmerge writes", "output.weights is 'x.safetensors', recomputes to "
        "'adapter_model.safetensors'", "output.dtype is 'bf16', recomputes to 'fp32'", "output.sha256 is 'abc', "
        "not a sha256", "output.modules is 3, recomputes to 14"]
    res = edited(lambda m: m["output"].pop("card_sha256"))
    assert res["figures"]["differing"] == ["output.card_sha256 is missing"]


def test_at_most_twenty_differences_are_kept_in_the_figures():
    want = {"figures": {f"f{i:02d}": 1.0 for i in range(25)}, "modules": {}}
    res = figures_check({"figures": {f"f{i:02d}": 2.0 for i in range(25)}, "modules": {}}, want)
    assert len(res["figures"]["differing"]) == 20 and res["detail"].endswith(" and 21 more")


def test_manifest_check_names_missing_sections_once_and_foreign_pins(toy, run_cli):
    """A missing section is one line (not also 'recomputes to'); the recipe's pins must equal the inputs' copy."""
    path = _project(run_cli)
    original = path.read_text()

    def edited(edit):
        path.write_text(original)
        return _manifest_detail(path, edit)["figures"]["differing"]

    def drop(*keys):
        return lambda m: [m.pop(k) for k in keys]

    assert edited(drop("tool", "kind", "method")) == ["tool is missing", "kind is missing", "method is missing"]
    assert edited(drop("created", "vecmerge_version")) == ["created is missing", "vecmerge_version is missing"]
    gone = edited(drop("resolved"))  # then each field of it is missing too
    assert gone[0] == "resolved is missing" and len(gone) > 2
    assert all(x.startswith("resolved.") and x.endswith(" is missing") for x in gone[1:])
    assert edited(drop("missing_modules")) == ["missing_modules is missing"]
    assert edited(drop("inputs"))[:2] == ["inputs is missing", "inputs names , the recipe reads v28, v51, v54"]
    assert edited(lambda m: m["output"].update(extra=1) or m["output"].pop("weights")) == [
        "output.extra is not a field vecmerge writes", "output.weights is missing"]
    assert edited(lambda m: m.update({f"k{i:02d}": 0 for i in range(25)}))[:1] == ["k00 is not a field vecmerge writes"]
    assert len(edited(lambda m: m.update({f"k{i:02d}": 0 for i in range(25)}))) == 20
    # the copy the model card shows must equal the recipe's pin (its hashes are compared with the files above)
    assert edited(lambda m: m["inputs"]["v28"].update(base_model="other")) == [
        "inputs.v28.base_model is 'other', recomputes to 'toy-base'"]
