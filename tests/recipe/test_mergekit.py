"""``vecmerge merge --config FILE.yml``: mergekit configurations as recipes, and the same adapter as by flags.

The translated recipe is compared key by key with the recipe written by hand; the written adapters with
the ones the same merge writes from flags (their weights' sha256 equal: the same bytes), so nothing about
the YAML path changes the numbers (the numbers themselves are checked in tests/methods).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from vecmerge.errors import RecipeError
from vecmerge.recipe.mergekit import from_mergekit
from vecmerge.testing import toy_adapter


@pytest.fixture
def three(three):
    """conftest's three, with a fourth adapter at loras/d-1 (a path that is not a name)."""
    toy_adapter(three / "loras" / "d-1", rank=4, seed=4)
    return three


def sha(folder: Path) -> str:
    return json.loads((folder / "vecmerge.json").read_text())["output"]["sha256"]


TIES_YAML = """\
merge_method: ties
base_model: Qwen/Qwen3-0.6B
models:
  - model: a
    parameters: {weight: 0.5}
  - model: b
    parameters: {weight: -1.0}
  - model: c
    parameters: {weight: 2.0}
parameters:
  density: 0.4
  normalize: true
  int8_mask: true
dtype: bfloat16
"""


def test_a_mergekit_yaml_writes_the_same_adapter_as_the_same_merge_by_flags(three, run_cli):
    (three / "ties.yml").write_text(TIES_YAML)
    res = run_cli("merge", "--config", "ties.yml", "--rank", "exact", "--out", "yml")
    assert res.exit_code == 0, res.output
    assert "config: ties.yml (mergekit ties -> vecmerge ties; sha256" in res.output
    res = run_cli("merge", "--method", "ties", "a", "b", "c", "--weights", "0.5,-1,2", "--density", "0.4",
                  "--normalize", "--dtype", "bf16", "--rank", "exact", "--base-model-id", "Qwen/Qwen3-0.6B",
                  "--out", "flags")
    assert res.exit_code == 0, res.output
    assert sha(three / "yml") == sha(three / "flags")
    man = json.loads((three / "yml" / "vecmerge.json").read_text())
    want = hashlib.sha256((three / "ties.yml").read_bytes()).hexdigest()
    assert man["config"] == {"format": "mergekit", "path": "ties.yml", "sha256": want, "merge_method": "ties",
                             "base_model": "Qwen/Qwen3-0.6B"}
    assert man["recipe"]["normalize"] is True and man["recipe"]["dtype"] == "bf16"
    assert run_cli("verify", "yml").exit_code == 0
    assert run_cli("run", "yml/vecmerge.json", "--out", "rerun").exit_code == 0  # the recipe re-runs on its own
    assert sha(three / "rerun") == sha(three / "yml")


def test_per_model_parameters_folders_and_slices(three, run_cli):
    """Per-model densities (a recipe, not flags), a LoRA folder by path, and slices that select layer 1 (``--only``)."""
    (three / "sl.yml").write_text("""\
merge_method: della
slices:
  - sources:
      - {model: a, layer_range: [1, 2], parameters: {weight: 1.0, density: 0.5}}
      - {model: loras/d-1, layer_range: [1, 2], parameters: {weight: 0.5, density: 0.6}}
parameters: {epsilon: 0.1}
""")
    assert run_cli("merge", "--config", "sl.yml", "--rank", "exact", "--out", "yml").exit_code == 0
    (three / "r.yaml").write_text("""\
method: della
models:
  - {model: a, weight: 1.0, density: 0.5}
  - {model: d_1, weight: 0.5, density: 0.6}
inputs: {d_1: loras/d-1}
epsilon: 0.1
only: '(^|\\.)layers\\.(1)\\.'
rank: exact
out: rec
""")
    res = run_cli("run", "r.yaml")
    assert res.exit_code == 0, res.output
    assert sha(three / "yml") == sha(three / "rec")
    mods = json.loads((three / "yml" / "vecmerge.json").read_text())["modules"]
    assert mods and all(".layers.1." in m for m in mods)


def test_linear_is_task_arithmetic_normalized_and_the_base_model_is_skipped(three):
    rec, notes = from_mergekit({"merge_method": "linear", "base_model": "a",
                                "models": [{"model": "a"}, {"model": "b", "parameters": {"weight": 0.3}},
                                           {"model": "c", "parameters": {"weight": 0.7}}]}, "f.yml", three)
    assert rec == {"method": "task_arithmetic", "normalize": True,
                   "models": [{"model": "b", "weight": 0.3}, {"model": "c", "weight": 0.7}]}
    assert notes == {"mergekit_method": "linear", "base_model": "a"}
    rec, _ = from_mergekit({"merge_method": "slerp", "base_model": "b", "parameters": {"t": 0.3},
                            "models": [{"model": "a"}, {"model": "b"}]}, "f.yml", three)
    assert rec["models"] == [{"model": "b"}, {"model": "a"}] and rec["t"] == 0.3  # from base_model (t=0) to a
    rec, _ = from_mergekit({"merge_method": "breadcrumbs", "models": ["a", "meta/llama+b"]}, "f.yml", three)
    assert rec["models"] == [{"model": "a", "density": 1.0}, {"model": "b", "density": 1.0}]  # mergekit's default


def test_every_unsupported_key_is_named_in_one_line(three):
    with pytest.raises(RecipeError) as e:
        from_mergekit({"merge_method": "passthrough", "models": [{"model": "a", "parameters": {"weight": [0, 1]}},
                                                                 {"model": "nope/missing"}],
                       "tokenizer_source": "union", "chat_template": "chatml", "modules": {}, "dtype": "int8",
                       "parameters": {"t": [{"filter": "mlp", "value": 0.5}]}}, "f.yml", three)
    p = e.value.problems
    assert p[0] == ("not supported for LoRA merges: tokenizer_source, chat_template, modules (vecmerge reads "
                    "merge_method, base_model, models, parameters, dtype, slices that select layers)")
    text = "\n".join(p)
    assert "merge_method='passthrough': it has no LoRA-to-LoRA form" in text
    assert "models[0].parameters.weight: a gradient (a list of values over the layers) is not supported" in text
    assert "parameters.t: a gradient" in text
    assert "'nope/missing' is neither a workspace adapter nor a LoRA folder (a hub id" in text
    assert "dtype='int8': one of float32, bfloat16, float16" in text
    with pytest.raises(RecipeError, match=r"slices\[1\]: layers 1-2 overlap another slice"):
        from_mergekit({"merge_method": "ties", "slices": [
            {"sources": [{"model": "a", "layer_range": [0, 2]}]},
            {"sources": [{"model": "a", "layer_range": [1, 3]}]}]}, "f.yml", three)
    with pytest.raises(RecipeError, match="differs between models"):
        from_mergekit({"merge_method": "breadcrumbs", "models": [{"model": "a", "parameters": {"gamma": 0.1}},
                                                                 {"model": "b", "parameters": {"gamma": 0.2}}]},
                      "f.yml", three)


def test_config_excludes_inputs_and_method_flags(three, run_cli):
    (three / "ties.yml").write_text(TIES_YAML)
    res = run_cli("merge", "--config", "ties.yml", "a", "--density", "0.5", "--out", "x")
    assert res.exit_code == 2 and "INPUT, --density come from ties.yml" in res.output
    res = run_cli("merge", "--out", "x")
    assert res.exit_code == 2 and "needs INPUT... and --method (or --config FILE.yml" in res.output
    (three / "bad.yml").write_text("merge_method: ties\nmodels: [a]\nslices: []\nfoo: 1\n")
    res = run_cli("merge", "--config", "bad.yml", "--out", "x")
    assert res.exit_code == 2 and "not supported for LoRA merges: foo" in res.output and not (three / "x").exists()
