"""Recipes: flags and YAML build the same object; every error is reported at once, with its key."""

import json
import shutil
from pathlib import Path

import pytest

from vecmerge.errors import RecipeError
from vecmerge.recipe.load import load
from vecmerge.recipe.recipe import Recipe

RECIPES = Path(__file__).resolve().parents[2] / "recipes"


def test_shipped_recipes_parse_and_run(toy, run_cli):
    for name in ("v58", "v59", "v60"):
        r = load(RECIPES / f"{name}.yaml")
        assert r.base == "v54" and r.dir == "v51 - v28" and r.trust == 0.0113
        assert (RECIPES / f"{name}.yaml").read_text().startswith("#")
        res = run_cli("run", RECIPES / f"{name}.yaml", "--json")
        assert res.exit_code == 0, res.output
        rep = json.loads(res.output)
        want = 0.0113 * (1.456 if name == "v59" else 1.0)
        assert rep["outputs"][0]["realized"]["global"] == pytest.approx(want, rel=1e-12)
        assert (toy / "out" / name / "adapter_model.safetensors").is_file()
    assert load(RECIPES / "v60.yaml").method == "orthogonal"


def test_flags_and_yaml_build_the_same_recipe(toy, run_cli, tmp_path):
    shutil.copy(RECIPES / "v58.yaml", toy / "r.yaml")
    a = json.loads(run_cli("run", "r.yaml", "--dry-run", "--json").output)
    b = json.loads(run_cli("project", "--base", "v54", "--dir", "v51 - v28", "--trust", "0.0113",
                           "--consensus-ref", "v54 - v54e2", "--dry-run", "--json").output)
    assert a["step"] == b["step"]
    assert a["outputs"][0]["figures"] == b["outputs"][0]["figures"]


def test_all_errors_reported_at_once():
    with pytest.raises(RecipeError) as e:
        Recipe.from_dict({"dir": "v51 - ", "trust": -1, "mode": "sideways", "rank": "big",
                          "consensus": {"ref": "x", "on_disagree": "shrug"}, "colour": 1, "dose": [0, "a"]})
    msg = str(e.value)
    for key in ("unknown key(s) ['colour']", "base: missing", "dir: cannot parse", "trust=-1", "mode='sideways'",
                "rank='big'", "on_disagree='shrug'", "dose="):
        assert key in msg, key
    assert len(e.value.problems) >= 8


def test_semantic_rules():
    with pytest.raises(RecipeError, match="trust or alpha: one is needed"):
        Recipe.from_dict({"base": "a", "dir": "b - c"})
    with pytest.raises(RecipeError, match="trust: only meaningful with dir"):
        Recipe.from_dict({"base": "a", "trust": 0.1})
    with pytest.raises(RecipeError, match="onto-ref: needs consensus.ref"):
        Recipe.from_dict({"base": "a", "dir": "b", "trust": 0.1, "mode": "onto-ref"})
    with pytest.raises(RecipeError, match="keep-base: base must be one adapter"):
        Recipe.from_dict({"base": "a + b", "dir": "b", "trust": 0.1, "rank": "keep-base"})
    r = Recipe.from_dict({"base": "a", "dir": "b", "trust": 0.1, "dose": 1.5})
    assert r.multiple == 1.5 and r.dose is None
    assert Recipe.from_dict({"base": "a", "dir": "b", "alpha": 1, "dose": "0.5, 1"}).dose == [0.5, 1.0]


def test_sha256_pins_are_checked(toy, run_cli):
    (toy / "pinned.yaml").write_text(
        "base: v54\ndir: v51 - v28\ntrust: 0.01\nout: p\n"
        "inputs:\n  v54: {path: v54, sha256: '0000000000000000000000000000000000000000000000000000000000000000'}\n")
    res = run_cli("run", "pinned.yaml")
    assert res.exit_code == 2 and "inputs.v54" in res.output and "changed since the recipe" in res.output
    assert not (toy / "p").exists()
    (toy / "unquoted.yaml").write_text("base: v54\ndir: v51 - v28\ntrust: 0.01\nout: p\n"
                                       "inputs:\n  v54: {path: v54, sha256: 1234}\n")
    res = run_cli("run", "unquoted.yaml")
    assert res.exit_code == 2 and "inputs.v54.sha256: 64 hex digits, quoted" in res.output


def test_bad_yaml_is_one_line(toy, run_cli):
    (toy / "bad.yaml").write_text("base: [\n")
    res = run_cli("run", "bad.yaml")
    assert res.exit_code == 2 and res.output.startswith("error: bad.yaml:2: not valid YAML")


def test_manifest_rerun_notices_a_changed_input_config(toy, run_cli):
    assert run_cli("project", "--base", "v54", "--dir", "v51-v28", "--trust", "0.0113", "--out", "o").exit_code == 0
    cfg = toy / "v28" / "adapter_config.json"
    cfg.write_text(cfg.read_text().replace('"lora_alpha": 8', '"lora_alpha": 16'))
    res = run_cli("run", "o/vecmerge.json", "--out", "o2")
    assert res.exit_code == 2 and "inputs.v28" in res.output and "adapter_config.json" in res.output
    assert not (toy / "o2").exists()


@pytest.mark.parametrize("args, match", [  # flags are named as typed (issue 12, item 11)
    (["--alpha", "nan"], "--alpha nan: a finite number"),
    (["--trust", "inf"], "--trust inf: a finite number"),
    (["--alpha", "0.1", "--dose", "1,inf"], "--dose '1,inf'"),
])
def test_non_finite_numbers_are_refused(toy, run_cli, args, match):
    res = run_cli("project", "--base", "v54", "--dir", "v51-v28", *args, "--out", "n")
    assert res.exit_code == 2 and match in res.output and "internal error" not in res.output


def test_unparsable_dir_reports_only_the_parse_error(toy, run_cli):
    res = run_cli("project", "--base", "v54", "--dir", "v51 - (v28", "--trust", "0.01", "--out", "o")
    assert res.exit_code == 2 and "expected ')'" in res.output and "only meaningful" not in res.output
