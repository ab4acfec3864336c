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
                             "base_model": "Qwen/Qwen3-0.6B", "mergekit_defaults": {"rescale": False},
                             "notes": ["base_model Qwen/Qwen3-0.6B: not checked against a, b, c, which declare no "
                                       "hub id (ORG/NAME) as base_model_name_or_path"]}
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
    rec, notes = from_mergekit({"merge_method": "linear", "base_model": "Org/base",
                                "models": [{"model": "Org/base"}, {"model": "b", "parameters": {"weight": 0.3}},
                                           {"model": "c", "parameters": {"weight": 0.7}}]}, "f.yml", three)
    assert rec == {"method": "task_arithmetic", "normalize": True, "base_model_id": "Org/base",
                   "models": [{"model": "b", "weight": 0.3}, {"model": "c", "weight": 0.7}]}
    assert notes == {"mergekit_method": "linear", "base_model": "Org/base", "defaults": {"normalize": True},
                     "notes": []}
    rec, _ = from_mergekit({"merge_method": "slerp", "base_model": "b", "parameters": {"t": 0.3},
                            "models": [{"model": "a"}, {"model": "b"}]}, "f.yml", three)
    assert rec["models"] == [{"model": "b"}, {"model": "a"}] and rec["t"] == 0.3  # from base_model (t=0) to a
    rec, _ = from_mergekit({"merge_method": "breadcrumbs", "models": ["a", "meta/llama+b"]}, "f.yml", three)
    assert rec["models"] == [{"model": "a", "density": 1.0}, {"model": "b", "density": 1.0}]  # mergekit's default


def test_a_lora_base_model_listed_in_models_is_not_silently_dropped(three, run_cli, dense_expr, dense_updates):
    """Issue 36, mergekit base_model also in models: the backbone (a hub id) is skipped, as mergekit skips the base
    input (its update is the origin, its weight in linear's sum); a LoRA as base_model is no origin: kept as a model
    where mergekit takes the base as one more input (linear, karcher; slerp's t = 0 end), refused in one line where
    mergekit would merge the differences from it (ties and the other task-vector methods), listed or not."""
    for listed in ("  - {model: a}\n", ""):
        (three / "t.yml").write_text(f"merge_method: ties\nbase_model: a\nmodels:\n{listed}  - {{model: b, "
                                     "parameters: {weight: 1}}\n  - {model: c, parameters: {weight: 1}}\n")
        res = run_cli("merge", "--config", "t.yml", "--out", "t")
        lines = [x for x in res.output.splitlines() if "base_model='a'" in x]
        assert res.exit_code == 2 and len(lines) == 1, res.output
        assert "a LoRA adapter, and mergekit's ties would merge the other models' differences from it" in lines[0]
        assert "name the backbone (a hub id or a model folder) as base_model and list 'a' under models" in lines[0]
        assert not (three / "t").exists()
    # linear: mergekit averages the base as one more model, its weight in the sum (0.2 a + 0.3 b + 0.5 c) / 1.0
    (three / "l.yml").write_text("merge_method: linear\nbase_model: a\nmodels:\n"
                                 + "".join(f"  - {{model: {m}, parameters: {{weight: {w}}}}}\n"
                                           for m, w in (("a", 0.4), ("b", 0.6), ("c", 1.0))))
    res = run_cli("merge", "--config", "l.yml", "--rank", "exact", "--dtype", "fp32", "--out", "l")
    assert res.exit_code == 0, res.output
    got, want = dense_updates(three / "l"), dense_expr({"a": 0.2, "b": 0.3, "c": 0.5})
    assert got.keys() == want.keys()
    for m in want:  # fp32 storage of exact factors: relative 1e-6
        assert (got[m] - want[m]).norm() <= 1e-6 * want[m].norm(), m
    (three / "n.yml").write_text("merge_method: linear\nbase_model: a\nmodels: [b, c]\n")
    res = run_cli("merge", "--config", "n.yml", "--out", "n")
    assert res.exit_code == 2 and "base_model='a': a LoRA adapter, which mergekit's linear averages as one more " \
        "model and needs its weight: list it under models with a weight" in res.output
    rec, _ = from_mergekit({"merge_method": "karcher", "base_model": "a", "models": ["b", "c"]}, "f.yml", three)
    assert rec["models"] == [{"model": "b"}, {"model": "c"}, {"model": "a"}]  # mergekit adds the base as an input
    rec, _ = from_mergekit({"merge_method": "ties", "base_model": "Org/base", "models": ["Org/base", "b", "c"]},
                           "f.yml", three)
    assert [e["model"] for e in rec["models"]] == ["b", "c"] and rec["base_model_id"] == "Org/base"


def test_every_unsupported_key_is_named_in_one_line(three):
    with pytest.raises(RecipeError) as e:
        from_mergekit({"merge_method": "passthrough", "models": [{"model": "a", "parameters": {"weight": "x y"}},
                                                                 {"model": "nope/missing"}],
                       "tokenizer_source": "union", "chat_template": "chatml", "modules": {}, "dtype": "int8",
                       "parameters": {"t": [{"filter": "mlp", "value": {"a": 1}}]}}, "f.yml", three)
    p = e.value.problems
    assert p[0] == ("modules: mergekit's per-module configurations are not supported for LoRA merges; use models "
                    "or slices")
    text = "\n".join(p)
    assert "merge_method='passthrough': it has no LoRA-to-LoRA form" in text
    assert "parameters.t[0].value" in text
    assert "'nope/missing' is neither a workspace adapter nor a LoRA folder (a hub id" in text
    assert "dtype='int8': one of float32, bfloat16, float16" in text
    assert "tokenizer_source" not in text and "chat_template" not in text  # ignored with a note, not refused
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
    assert res.exit_code == 2 and "foo: not a mergekit key" in res.output and not (three / "x").exists()


def _manifest(folder: Path) -> dict:
    return json.loads((folder / "vecmerge.json").read_text())


def test_config_without_normalize_uses_mergekits_default_and_says_so(three, run_cli):
    """Item 2 of issue 36: ties and dare_ties with no normalize key take mergekit's defaults (ties: normalize true;
    dare_*: normalize false, rescale true, the L1 rescale), written exactly as the flags that spell them; the report
    and the manifest say which rule was used."""
    (three / "t.yml").write_text("merge_method: ties\nmodels:\n  - {model: a, parameters: {weight: 0.5}}\n"
                                 "  - {model: b, parameters: {weight: 2}}\nparameters: {density: 0.5}\n")
    res = run_cli("merge", "--config", "t.yml", "--rank", "exact", "--out", "yml")
    assert res.exit_code == 0, res.output
    assert "config: mergekit's defaults for what the file leaves out: normalize: true, rescale: false" in res.output
    assert _manifest(three / "yml")["config"]["mergekit_defaults"] == {"normalize": True, "rescale": False}
    assert run_cli("merge", "--method", "ties", "a", "b", "--weights", "0.5,2", "--density", "0.5", "--normalize",
                   "--rank", "exact", "--out", "flags").exit_code == 0
    assert sha(three / "yml") == sha(three / "flags")
    (three / "d.yml").write_text("merge_method: dare_ties\nmodels:\n  - {model: a, parameters: {weight: 0.5}}\n"
                                 "  - {model: b, parameters: {weight: 2}}\nparameters: {density: 0.5}\n")
    res = run_cli("merge", "--config", "d.yml", "--rank", "exact", "--seed", "3", "--out", "dyml")
    assert res.exit_code == 0, res.output  # --seed beside --config, as --rank
    assert "normalize: false, rescale: true" in res.output
    assert run_cli("merge", "--method", "dare_ties", "a", "b", "--weights", "0.5,2", "--density", "0.5",
                   "--no-normalize", "--rescale", "--seed", "3", "--rank", "exact", "--out", "dflags").exit_code == 0
    assert sha(three / "dyml") == sha(three / "dflags")
    res = run_cli("merge", "--method", "dare_ties", "a", "b", "--density", "0.5", "--rescale", "--out", "x")
    assert res.exit_code == 2 and "--rescale: mergekit's option" in res.output and "--normalize too" in res.output


@pytest.mark.parametrize("method,base,noted", [("slerp", None, True), ("nuslerp", None, True),
                                               ("nuslerp", "Org/base", False), ("karcher", "Org/base", True),
                                               ("multislerp", None, True), ("ties", None, False)])
def test_a_meaning_that_differs_from_mergekit_is_noted_on_every_config_run(three, run_cli, method, base, noted):
    """Item 3: slerp, nuslerp without base_model and karcher with one interpolate full weights in mergekit and
    updates here: a note in the report and the manifest (docs/METHODS.md, "mergekit configurations")."""
    params = {"slerp": "parameters: {t: 0.3}\n", "ties": "parameters: {density: 0.5}\n"}.get(method, "")
    base_line = f"base_model: {base}\n" if base else ""
    (three / "c.yml").write_text(f"merge_method: {method}\nmodels: [a, b]\n{params}{base_line}")
    res = run_cli("merge", "--config", "c.yml", "--rank", "exact", "--out", "o")
    assert res.exit_code == 0, res.output
    notes = _manifest(three / "o")["config"]["notes"]
    said = [n for n in notes if "full weights" in n]
    assert bool(said) == noted, (notes, res.output)
    for n in said:
        assert f"config note: {n}" in res.output and n.startswith(method)


def test_linear_weights_summing_to_zero_refused_and_a_difference_noted(three, run_cli):
    """Item 5: linear (normalize on) with weights 1, -1 cannot divide by 0: refused naming the key and the fix;
    task_arithmetic with 1, -1 writes the difference, and says so."""
    (three / "z.yml").write_text("merge_method: linear\nmodels:\n  - {model: a, parameters: {weight: 1}}\n"
                                 "  - {model: b, parameters: {weight: -1}}\n")
    res = run_cli("merge", "--config", "z.yml", "--out", "z")
    assert res.exit_code == 2 and "parameters.normalize: merge_method linear divides by the sum of the weights, " \
        "which is 0 here" in res.output and "use merge_method task_arithmetic" in res.output
    assert not (three / "z").exists()
    (three / "d.yml").write_text((three / "z.yml").read_text().replace("linear", "task_arithmetic"))
    res = run_cli("merge", "--config", "d.yml", "--out", "d")
    assert res.exit_code == 0 and "config note: task_arithmetic with a negative weight: the output subtracts" \
        in res.output
    assert run_cli("refactor", "a - b", "--out", "ref").exit_code == 0
    assert sha(three / "d") == sha(three / "ref")


def test_tokenizer_keys_ignored_rank_in_the_file_and_the_hub_base_checked(three, run_cli):
    """tokenizer_source and chat_template: a note, not a refusal; rank in the file (an element-wise method needs
    one); a hub base_model that an adapter's declared hub id contradicts: refused, unless allowed."""
    toy_adapter(three / "q", rank=4, seed=5, base_model="Org/other")
    (three / "k.yml").write_text("merge_method: ties\nmodels: [a, b]\nparameters: {density: 0.5}\nrank: 4\n"
                                 "tokenizer_source: union\nchat_template: chatml\n")
    res = run_cli("merge", "--config", "k.yml", "--out", "k")
    assert res.exit_code == 0, res.output
    assert "config note: tokenizer_source: ignored" in res.output and "config note: chat_template: ignored" in \
        res.output
    assert _manifest(three / "k")["recipe"]["rank"] == "4"
    res = run_cli("merge", "--config", "k.yml", "--space", "core", "--rank", "exact", "--out", "core")
    assert res.exit_code == 0, res.output  # --space beside --config, as --rank
    assert _manifest(three / "core")["recipe"]["space"] == "core"
    (three / "h.yml").write_text("merge_method: task_arithmetic\nbase_model: Org/base\nmodels: [a, q]\n")
    res = run_cli("merge", "--config", "h.yml", "--out", "h")
    assert res.exit_code == 2 and "base_model: Org/base is not the base model the adapters declare: q (Org/other)" \
        in res.output and not (three / "h").exists()
    res = run_cli("merge", "--config", "h.yml", "--out", "h", "--allow-base-mismatch")
    assert res.exit_code == 0, res.output
