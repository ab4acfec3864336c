"""The PEFT format's rules, checked against PEFT itself: pattern resolution, scales, targets, refusals."""

import json

import pytest

from vecmerge.errors import AdapterError
from vecmerge.peft.adapter import Adapter
from vecmerge.peft.format import LoraConfig, factor_keys, pattern_key, peft_scale, targeted
from vecmerge.peft.write import _patterns
from vecmerge.testing import toy_adapter


def test_pattern_key_is_peft_rule():
    from peft.utils.other import get_pattern_key

    keys = ["down_proj", "model.layers.0.mlp.up_proj", r"layers\.1\..*proj"]
    for name in ["model.layers.0.mlp.up_proj", "model.layers.1.mlp.up_proj", "model.layers.0.mlp.down_proj",
                 "model.layers.1.self_attn.q_proj", "model.layers.10.mlp.up_proj"]:
        ours = pattern_key(keys, name)
        assert (ours if ours is not None else name) == get_pattern_key(keys, name)
    assert peft_scale(16, 4, True) == 8.0 and peft_scale(16, 4, False) == 4.0


@pytest.mark.parametrize("keys, name", [
    (["up_proj", r"layers\.1\..*proj"], "model.layers.1.mlp.up_proj"),          # two keys match: the first wins
    ([r"layers\.1\..*proj", "up_proj"], "model.layers.1.mlp.up_proj"),
    (["up_proj"], "model.layers.0.mlp.gate_up_proj"),                              # no match without a dot boundary
    (["mlp.up_proj", "up_proj"], "model.layers.0.mlp.up_proj"),
    (["q_proj|k_proj"], "model.layers.0.self_attn.k_proj"),
])
def test_pattern_resolution_equals_peft_on_hard_names(keys, name):
    """Compared with PEFT's own get_pattern_key (it returns the name itself when no key matches)."""
    from peft.utils.other import get_pattern_key

    ours = pattern_key(keys, name)
    assert (ours if ours is not None else name) == get_pattern_key(keys, name)
    cfg = LoraConfig(r=8, lora_alpha=8, rank_pattern={k: i + 2 for i, k in enumerate(keys)})
    want = cfg.rank_pattern.get(get_pattern_key(keys, name), 8)
    assert cfg.resolve(name)[0] == want


def test_factor_keys_are_the_keys_peft_saves():
    assert factor_keys("model.layers.0.mlp.up_proj", "linear") == (
        "base_model.model.model.layers.0.mlp.up_proj.lora_A.weight",
        "base_model.model.model.layers.0.mlp.up_proj.lora_B.weight")
    assert factor_keys("model.embed_tokens", "embedding") == (
        "base_model.model.model.embed_tokens.lora_embedding_A", "base_model.model.model.embed_tokens.lora_embedding_B")


def test_target_rules_follow_peft():
    q = "model.layers.3.self_attn.q_proj"
    assert targeted({"target_modules": ["q_proj"]}, q)
    assert targeted({"target_modules": [q]}, q)
    assert not targeted({"target_modules": ["k_proj"]}, q)
    assert not targeted({"target_modules": ["proj"]}, q)                       # whole components only
    assert targeted({"target_modules": r".*\.q_proj"}, q)
    assert not targeted({"target_modules": r"q_proj"}, q)                      # a string must fullmatch
    assert targeted({"target_modules": ["q_proj"], "layers_to_transform": [3]}, q)
    assert not targeted({"target_modules": ["q_proj"], "layers_to_transform": [0, 1]}, q)
    assert targeted({"target_modules": ["q_proj"], "layers_to_transform": 3, "layers_pattern": "layers"}, q)
    assert not targeted({"target_modules": ["q_proj"], "exclude_modules": ["q_proj"]}, q)
    # PEFT expands "all-linear" to every linear layer before its own check, so each module saved under it is targeted
    assert targeted({"target_modules": "all-linear"}, q) and targeted({"target_modules": "all-linear"}, "lm_head")
    assert not targeted({"target_modules": "all-linear", "exclude_modules": r".*q_proj"}, q)


def _edit_config(path, **changes):
    cfg = json.loads((path / "adapter_config.json").read_text())
    cfg.update(changes)
    (path / "adapter_config.json").write_text(json.dumps(cfg))


@pytest.mark.parametrize("change, match", [
    ({"peft_type": "IA3"}, "peft_type is IA3"),
    ({"use_dora": True}, "use_dora is set: DoRA"),
    ({"lora_bias": True}, "lora_bias is set but .* store no lora_B.bias"),  # read when the biases are there
    ({"init_lora_weights": "pissa"}, "changes the base weights"),
    ({"r": 0}, "invalid r=0"),
    ({"r": 5}, "rank 4 but the config resolves r=5"),
    ({"modules_to_save": ["lm_head"]}, "modules_to_save.*--modules-to-save drop"),
])
def test_config_refusals(tmp_path, change, match):
    p = toy_adapter(tmp_path / "a", rank=4)
    _edit_config(p, **change)
    with pytest.raises(AdapterError, match=match) as e:
        Adapter(p)  # the config's own refusals come from LoraConfig.read; rank and modules_to_save from Adapter
    assert str(p) in str(e.value) and "\n" not in str(e.value)


def test_resolve_takes_patterns_then_defaults():
    cfg = LoraConfig(r=8, lora_alpha=16, rank_pattern={"down_proj": 4}, alpha_pattern={r"layers\.1\..*": 2.0})
    assert cfg.resolve("model.layers.0.mlp.down_proj") == (4, 16.0)
    assert cfg.resolve("model.layers.1.self_attn.q_proj") == (8, 2.0)
    assert cfg.scale("model.layers.0.mlp.down_proj") == 4.0


def test_rank_patterns_for_names_that_end_in_each_other():
    ranks = {"model.layers.0.mlp.up_proj": 1, "mtp.model.layers.0.mlp.up_proj": 2, "model.layers.1.mlp.up_proj": 2}
    alphas = {m: float(r) for m, r in ranks.items()}
    r0, a0, rp, ap = _patterns(ranks, alphas)
    cfg = LoraConfig(r=r0, lora_alpha=a0, rank_pattern=rp, alpha_pattern=ap)
    assert all(cfg.resolve(m) == (ranks[m], alphas[m]) for m in ranks)


def test_layers_and_type_paths_of_module_names():
    from vecmerge.peft.format import module_layer, type_path

    assert module_layer("model.layers.3.self_attn.q_proj") == 3 and module_layer("transformer.h.10.mlp.c_fc") == 10
    assert module_layer("lm_head") is None
    assert type_path("transformer.h.0.attn.c_proj") == "attn.c_proj"
    assert type_path("model.layers.12.mlp.up_proj") == "mlp.up_proj" and type_path("x.0.q") == "q"
    assert type_path("lm_head") == "lm_head" and type_path("transformer.wte") == "transformer.wte"
    assert type_path("model.layers.0") == "model.layers.0"  # nothing after the index: the whole name


def test_module_types_are_the_shortest_unambiguous_suffixes():
    """GPT-2's attn.c_proj and mlp.c_proj stay apart, q_proj and c_attn stay short, transformer.wte is wte; the
    experts of one MoE parameter share its type (ModuleSpec.target). Names may come from any iterable."""
    from types import SimpleNamespace

    from vecmerge.peft.format import module_types

    names = ["transformer.h.0.attn.c_proj", "transformer.h.0.mlp.c_proj", "transformer.h.1.attn.c_attn",
             "transformer.h.1.attn.c_proj", "transformer.wte", "lm_head", "model.layers.0.self_attn.q_proj"]
    assert module_types(iter(names)) == {
        "transformer.h.0.attn.c_proj": "attn.c_proj", "transformer.h.0.mlp.c_proj": "mlp.c_proj",
        "transformer.h.1.attn.c_attn": "c_attn", "transformer.h.1.attn.c_proj": "attn.c_proj",
        "transformer.wte": "wte", "lm_head": "lm_head", "model.layers.0.self_attn.q_proj": "q_proj"}
    target = "model.layers.0.mlp.experts.gate_up_proj"
    experts = [f"{target}.{e}" for e in range(3)]
    specs = {m: SimpleNamespace(expert=e, target=target) for e, m in enumerate(experts)}
    specs["model.layers.0.mlp.gate"] = SimpleNamespace(expert=None, target="model.layers.0.mlp.gate.weight")
    got = module_types(experts + ["model.layers.0.mlp.gate", "model.layers.0.mlp.down_proj"], specs)
    assert got == {**dict.fromkeys(experts, "gate_up_proj"), "model.layers.0.mlp.gate": "gate",
                   "model.layers.0.mlp.down_proj": "down_proj"}


def test_pattern_errors_name_the_field_and_the_file():
    from vecmerge.io.patterns import PatternError

    with pytest.raises(PatternError) as e:
        pattern_key(["(a+)+"], "model.q_proj")
    assert str(e.value).startswith("adapter_config.json: rank_pattern key '(a+)+': a repeat inside a repeat")
    with pytest.raises(PatternError) as e:
        pattern_key(["(a+)+"], "model.q_proj", field="alpha_pattern", source="v28/adapter_config.json")
    assert str(e.value).startswith("v28/adapter_config.json: alpha_pattern key '(a+)+'")


def test_rslora_scale_of_a_config():
    """PEFT's rsLoRA scale alpha / sqrt(r), per module through the patterns (exact: powers of two)."""
    cfg = LoraConfig(r=4, lora_alpha=8, use_rslora=True, rank_pattern={"up_proj": 16})
    assert cfg.scale("model.layers.0.self_attn.q_proj") == 4.0 and cfg.scale("model.layers.0.mlp.up_proj") == 2.0


TARGET_CONFIGS = [
    {"target_modules": ["q_proj", "up_proj"]},
    {"target_modules": ["self_attn.q_proj"]},
    {"target_modules": r".*\.layers\.3\..*proj"},
    {"target_modules": ["q_proj", "up_proj"], "exclude_modules": ["up_proj"]},
    {"target_modules": ["q_proj", "up_proj"], "exclude_modules": r".*layers\.12.*"},
    {"target_modules": ["q_proj", "up_proj", "c_attn"], "layers_to_transform": 3},
    {"target_modules": ["q_proj", "up_proj"], "layers_to_transform": [3, 12], "layers_pattern": "layers"},
    {"target_modules": ["q_proj", "up_proj", "c_attn"], "layers_to_transform": [3], "layers_pattern": ["h", "layers"]},
    {"target_modules": ["q_proj"], "layers_to_transform": [0], "layers_pattern": "decoder.layers"},
    {"target_modules": ["q_proj"], "layers_to_transform": []},
    {"target_modules": []},
    {"target_modules": "model.layers.3.self_attn.q_proj"},
    {"target_modules": ["q_proj", "c_attn"], "layers_to_transform": [3], "layers_pattern": "h"},
]
TARGET_NAMES = ["model.layers.3.self_attn.q_proj", "model.layers.12.mlp.up_proj", "model.layers.3.mlp.q_proj_x",
                "lm_head", "model.decoder.layers.0.q_proj", "transformer.h.3.attn.c_attn", "q_proj",
                "model.layers.3.self_attn.k_proj"]


@pytest.mark.parametrize("raw", TARGET_CONFIGS)
def test_targeted_equals_peft_check_target_module_exists(raw):
    """The reference is PEFT's own check_target_module_exists on a peft.LoraConfig of the same fields."""
    import peft
    from peft.tuners.tuners_utils import check_target_module_exists

    cfg = peft.LoraConfig(**raw)
    for name in TARGET_NAMES:
        assert targeted(raw, name) == bool(check_target_module_exists(cfg, name)), name


@pytest.mark.parametrize("raw, problem", [
    ({"target_modules": 3}, "target_modules=3 (a regex string or a list of names)"),
    ({"target_modules": ["q_proj"], "exclude_modules": [1]}, "exclude_modules=[1] (a regex string or a list of names)"),
    ({"target_modules": ["q_proj"], "layers_pattern": {}}, "layers_pattern={} (a regex string or a list of names)"),
    ({"target_modules": ["q_proj"], "layers_to_transform": "3"},
     "layers_to_transform='3' (a layer index or a list of them)"),
    ({"target_modules": ["q_proj"], "layers_to_transform": [True]},
     "layers_to_transform=[True] (a layer index or a list of them)"),
])
def test_targeted_refuses_fields_of_the_wrong_type_by_name(raw, problem):
    with pytest.raises(AdapterError) as e:
        targeted(raw, "model.layers.3.self_attn.q_proj", source="c.json")
    assert str(e.value) == f"c.json: invalid {problem}; fix the config"


GOOD = {"peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": ["q_proj"]}


@pytest.mark.parametrize("change, problem", [
    ({"r": True}, "r=True (a positive integer up to 1048576)"),
    ({"r": 1048577}, "r=1048577 (a positive integer up to 1048576)"),
    ({"r": 2.0}, "r=2.0 (a positive integer up to 1048576)"),
    ({"lora_alpha": "8"}, "lora_alpha='8' (a finite number)"),
    ({"lora_alpha": True}, "lora_alpha=True (a finite number)"),
    ({"rank_pattern": {"q_proj": 0}}, "rank_pattern (a mapping of regex to positive integers)"),
    ({"rank_pattern": {"q_proj": 1048577}}, "rank_pattern (a mapping of regex to positive integers)"),
    ({"rank_pattern": ["q_proj"]}, "rank_pattern (a mapping of regex to positive integers)"),
    ({"alpha_pattern": {"q_proj": "x"}}, "alpha_pattern (a mapping of regex to finite numbers)"),
    ({"alpha_pattern": 5}, "alpha_pattern (a mapping of regex to finite numbers)"),
    ({"use_rslora": "yes"}, "use_rslora='yes' (true or false)"),
    ({"fan_in_fan_out": 1}, "fan_in_fan_out=1 (true or false)"),
    ({"base_model_name_or_path": 7}, "base_model_name_or_path=7 (a string)"),
    ({"modules_to_save": "lm_head"}, "modules_to_save='lm_head' (a list of module names)"),
    ({"modules_to_save": [3]}, "modules_to_save=[3] (a list of module names)"),
    ({"r": 0, "lora_alpha": None}, "r=0 (a positive integer up to 1048576), lora_alpha=None (a finite number)"),
])
def test_config_fields_are_checked_and_named(tmp_path, change, problem):
    """Each field vecmerge reads is type-checked; all problems of a file in one line naming it."""
    from vecmerge.peft.format import LoraConfig

    path = tmp_path / "adapter_config.json"
    path.write_text(json.dumps({**GOOD, **change}))
    with pytest.raises(AdapterError) as e:
        LoraConfig.read(path)
    assert str(e.value) == f"{path}: invalid {problem}; fix the config"


def test_config_limits_and_defaults_are_accepted(tmp_path):
    """The bounds themselves are valid (r = 1 and 2^20, lora_alpha 0); absent optional fields take PEFT's defaults."""
    from vecmerge.peft.format import LoraConfig

    path = tmp_path / "adapter_config.json"
    path.write_text(json.dumps({**GOOD, "r": 1048576, "lora_alpha": 0, "rank_pattern": {"q_proj": 1},
                                "use_rslora": None, "base_model_name_or_path": None, "modules_to_save": None}))
    cfg = LoraConfig.read(path)
    assert (cfg.r, cfg.lora_alpha, cfg.use_rslora, cfg.fan_in_fan_out, cfg.modules_to_save) == (1048576, 0.0, False,
                                                                                                 False, [])
    assert (cfg.rank_pattern, cfg.alpha_pattern, cfg.base_model, cfg.source) == ({"q_proj": 1}, {}, None, str(path))
    path.write_text(json.dumps({"r": 8, "lora_alpha": 16.5, "use_rslora": True, "fan_in_fan_out": True,
                                "base_model_name_or_path": "org/m", "modules_to_save": ["lm_head"]}))
    cfg = LoraConfig.read(path)  # peft_type defaults to LORA
    assert (cfg.lora_alpha, cfg.use_rslora, cfg.fan_in_fan_out, cfg.base_model, cfg.modules_to_save) == (
        16.5, True, True, "org/m", ["lm_head"])
    assert cfg.target_modules is None and cfg.raw["r"] == 8 and cfg.scale_rule == "alpha/sqrt(r) (rsLoRA)"


@pytest.mark.parametrize("raw, message", [
    ([1, 2], "expected a JSON object; restore the file from the training run"),
    ({**GOOD, "peft_type": "lora"}, None),
    ({**GOOD, "peft_type": "ia3"}, "peft_type is IA3; vecmerge handles LoRA adapters only"),
    ({**GOOD, "use_dora": False}, None),
    ({**GOOD, "layer_replication": [[0, 1]]}, "layer_replication is set: layer replication changes the model's layers; "
                                               "vecmerge handles plain LoRA only"),
    ({**GOOD, "init_lora_weights": "PiSSA_niter_4"}, "init_lora_weights='PiSSA_niter_4' changes the base weights"),
    ({**GOOD, "init_lora_weights": "loftq"}, "init_lora_weights='loftq' changes the base weights"),
    ({**GOOD, "init_lora_weights": True}, None),
    ({**GOOD, "init_lora_weights": "gaussian"}, None),
])
def test_config_refusals_word_for_word(tmp_path, raw, message):
    from vecmerge.peft.format import LoraConfig

    path = tmp_path / "adapter_config.json"
    path.write_text(json.dumps(raw))
    if message is None:
        assert LoraConfig.read(path).r == 4
        return
    with pytest.raises(AdapterError) as e:
        LoraConfig.read(path)
    assert str(e.value).startswith(f"{path}: {message}")
    with pytest.raises(AdapterError, match="no adapter_config.json; point at a PEFT LoRA folder"):
        LoraConfig.read(tmp_path / "nothing" / "adapter_config.json")


def test_a_bad_pattern_key_is_refused_when_the_config_is_read(tmp_path):
    from vecmerge.io.patterns import PatternError
    from vecmerge.peft.format import LoraConfig

    path = tmp_path / "adapter_config.json"
    path.write_text(json.dumps({**GOOD, "alpha_pattern": {"(a+)+": 2}}))
    with pytest.raises(PatternError) as e:
        LoraConfig.read(path)
    assert str(e.value).startswith(f"{path}: alpha_pattern key '(a+)+': a repeat inside a repeat")


TARGET_REGEX_FIELDS = [
    ("target_modules", lambda rx: {"target_modules": rx}),
    ("exclude_modules", lambda rx: {"target_modules": ["q_proj"], "exclude_modules": rx}),
    ("layers_pattern", lambda rx: {"target_modules": ["q_proj"], "layers_to_transform": [3], "layers_pattern": rx}),
    ("layers_pattern", lambda rx: {"target_modules": ["q_proj"], "layers_to_transform": [3], "layers_pattern": [rx]}),
]


@pytest.mark.parametrize("field, raw", TARGET_REGEX_FIELDS)
def test_targeted_names_the_field_and_file_of_an_invalid_regex(field, raw):
    """A regex string of the config that does not compile is one line naming the file, the field and the fix."""
    from vecmerge.io.patterns import PatternError

    with pytest.raises(PatternError) as e:
        targeted(raw("q_proj("), "model.layers.3.self_attn.q_proj", source="c.json")
    assert str(e.value).startswith(f"c.json: {field}: not a valid regex (")
    assert "escape special characters" in str(e.value)


@pytest.mark.parametrize("field, raw", TARGET_REGEX_FIELDS[:3])
def test_targeted_stops_a_slow_regex_and_names_the_field_and_file(field, raw):
    """A regex that passes the static check but backtracks for seconds on a long module name is stopped at the
    1 s budget (about 1 s per case), naming the file, the field and the module; never a hang or a crash."""
    from vecmerge.io.patterns import MATCH_BUDGET_S, PatternError

    slow = r"\w*\w*\w*\w*!"  # 4 variable repeats: allowed, ~len**4 steps on a miss (seconds for 400 characters)
    name = "a" * 400 + ".q_proj"
    with pytest.raises(PatternError) as e:
        targeted(raw(slow), name, source="c.json")
    assert str(e.value).startswith(f"c.json: {field}: matching module 'aaaa")
    assert f"took over {MATCH_BUDGET_S:g} s (the regex backtracks); simplify the pattern" in str(e.value)
