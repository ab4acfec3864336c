"""The one shared toy-adapter factory: real PEFT folders, written by vecmerge.testing or by PEFT itself.

Fixtures:
    three        adapters a (r 4), b (r 4, alpha 4), c (r 6, rsLoRA) of a 2-layer toy Qwen3, named in
                 vecmerge.yaml; the test runs with it as the current directory.
    toy          a folder with v28, v51, v54e2, v54 (vecmerge.testing.toy_trajectory) and
                 vecmerge.yaml; the test runs with it as the current directory.
    tiny_base    a tiny random transformers Qwen3 saved to disk (session-wide).
    peft_adapter a factory: peft_adapter(name, **LoraConfig kwargs) saves a real PEFT adapter of
                 tiny_base with random (non-zero) A and B, and returns its folder.
    run_cli      runs the vecmerge CLI in-process: run_cli("project", "--base", ...) -> Result.
    peft_deltas  peft_deltas(model) -> {module: get_delta_weight as float64} of a loaded PeftModel.
    dense_updates dense_updates(folder) -> {module: scale * B @ A in float64, the LoRA layout (out, in)},
                 read with safetensors and PEFT's own pattern rule: a reference independent of vecmerge.
    dense_expr   dense_expr({"v54": 1, "v51": c, ...}) -> {module: sum of c * dense update} (names in ./).
    hf_base      hf_base(kind) -> a tiny random transformers model saved to disk (session-wide): "llama" and
                 "mistral" (two architectures of equal shapes), "gpt2" (Conv1D attn.c_proj and mlp.c_proj).
    peft_on      peft_on(base, folder, seed=0, **LoraConfig kwargs) saves a real PEFT adapter of ``base``
                 (random non-zero factors; modules_to_save weights moved off the base) and returns the folder.
    peft_mu      PEFT's own ``peft.utils.merge_utils`` (TIES, DARE, magnitude pruning on dense tensors): the
                 independent definition of the element-wise merges.

Tests that train a model or load one through PEFT/transformers carry ``@pytest.mark.slow``.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from pathlib import Path

import pytest
import torch

from vecmerge.testing import toy_adapter, toy_trajectory

# The one tiny decoder shape every random test model uses (Qwen3, Llama, Mistral: equal shapes).
TINY_DECODER = dict(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=8, max_position_embeddings=64, tie_word_embeddings=False)
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@pytest.fixture
def three(tmp_path, monkeypatch):
    """Adapters a (r 4), b (r 4, alpha 4), c (r 6, rsLoRA) of a 2-layer toy Qwen3, named in vecmerge.yaml."""
    root = tmp_path / "three"
    toy_adapter(root / "a", rank=4, seed=1)
    toy_adapter(root / "b", rank=4, seed=2, lora_alpha=4)
    toy_adapter(root / "c", rank=6, seed=3, rslora=True, lora_alpha=6)
    (root / "vecmerge.yaml").write_text("adapters:\n  a: a\n  b: b\n  c: c\n")
    monkeypatch.chdir(root)
    return root


@pytest.fixture
def toy(tmp_path, monkeypatch):
    root = tmp_path / "toy"
    toy_trajectory(root)
    monkeypatch.chdir(root)
    return root


def save_peft(base: Path, out: Path, seed: int = 0, dtype=None, bump_saved: bool = False, **lora_kwargs) -> Path:
    """The one maker of real PEFT adapters: ``base`` wrapped by PEFT with random non-zero factors, saved to ``out``.

    Args:
        base (Path): a transformers model folder. out (Path): where PEFT saves the adapter. seed (int): torch seed
            set before the base is loaded. dtype (torch.dtype | None): cast the PEFT model before saving.
        bump_saved (bool): add 0.01 to ``modules_to_save`` copies (a trained head differs from the base).
        **lora_kwargs: ``peft.LoraConfig`` fields over ``r=4, lora_alpha=8, init_lora_weights=False``.
    """
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = get_peft_model(AutoModelForCausalLM.from_pretrained(base),
                               LoraConfig(**{"r": 4, "lora_alpha": 8, "init_lora_weights": False, **lora_kwargs}))
        if dtype is not None:
            model = model.to(dtype)
        if bump_saved:
            for name, prm in model.named_parameters():
                if "modules_to_save" in name:
                    prm.data += 0.01
        model.save_pretrained(out)
    return Path(out)


@pytest.fixture(scope="session")
def tiny_base(hf_base) -> Path:
    """A tiny random transformers Qwen3 saved to disk (session-wide)."""
    return hf_base("qwen3")


@pytest.fixture(scope="session")
def peft_adapter(tiny_base, tmp_path_factory):
    """Factory of real PEFT adapters on ``tiny_base``: random non-zero factors, any LoraConfig (q/k/v/o/gate/up/down
    by default); the config names ``tiny_base`` by its absolute path."""
    root = tmp_path_factory.mktemp("peft_adapters")
    made = {}

    def make(name: str, seed: int = 0, dtype=None, **lora_kwargs) -> Path:
        if name not in made:
            out = save_peft(tiny_base, root / name, seed, dtype, **{"target_modules": list(TARGETS), **lora_kwargs})
            cfg = json.loads((out / "adapter_config.json").read_text())
            cfg["base_model_name_or_path"] = str(tiny_base)
            (out / "adapter_config.json").write_text(json.dumps(cfg))
            made[name] = out
        return made[name]

    return make


@pytest.fixture(scope="session")
def hf_base(tmp_path_factory):
    """Factory of tiny random transformers models saved to disk: qwen3, llama, mistral (equal shapes), gpt2;
    llama_bias: llama whose linear layers have biases (for lora_bias adapters, which PEFT merges into them)."""
    made = {}

    def make(kind: str) -> Path:
        if kind in made:
            return made[kind]
        import transformers as tf

        torch.manual_seed(0)
        if kind == "gpt2":
            model = tf.GPT2LMHeadModel(tf.GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=64, n_positions=32,
                                                     bos_token_id=0, eos_token_id=0))
        else:
            cls, cfg = {"qwen3": (tf.Qwen3ForCausalLM, tf.Qwen3Config), "llama": (tf.LlamaForCausalLM, tf.LlamaConfig),
                        "mistral": (tf.MistralForCausalLM, tf.MistralConfig),
                        "llama_bias": (tf.LlamaForCausalLM, tf.LlamaConfig)}[kind]
            extra = dict(attention_bias=True, mlp_bias=True) if kind == "llama_bias" else {}
            model = cls(cfg(**TINY_DECODER, **extra))
        path = tmp_path_factory.mktemp(f"base_{kind}")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model.save_pretrained(path)
        made[kind] = path
        return path

    return make


@pytest.fixture(scope="session")
def peft_on():
    """``peft_on(base, folder, seed=0, **LoraConfig kwargs)``: a real PEFT adapter of ``base``, saved by PEFT
    (``modules_to_save`` weights moved off the base)."""
    def make(base: Path, folder: Path, seed: int = 0, **lora_kwargs) -> Path:
        return save_peft(base, folder, seed, bump_saved=True, **lora_kwargs)

    return make


@pytest.fixture
def run_cli():
    """Run ``vecmerge ARGS`` in-process with click's runner; returns the click Result."""
    from click.testing import CliRunner

    from vecmerge.cli import main

    def run(*args, **kwargs):
        runner = CliRunner()
        return runner.invoke(main, ["--quiet", *map(str, args)], catch_exceptions=False, **kwargs)

    return run


def _peft_deltas(model) -> dict:
    from peft.tuners.lora import LoraLayer

    out = {}
    for name, mod in model.named_modules():
        if isinstance(mod, LoraLayer) and "default" in getattr(mod, "scaling", {}):
            with torch.no_grad():
                out[name.removeprefix("base_model.model.")] = mod.get_delta_weight("default").double()
    return out


@pytest.fixture
def peft_deltas():
    """``{module: PEFT's get_delta_weight('default') as float64}`` of a loaded PeftModel (base layout)."""
    return _peft_deltas


def _dense_updates(folder) -> dict:
    from peft.utils.other import get_pattern_key
    from safetensors.torch import load_file

    folder = Path(folder)
    cfg = json.loads((folder / "adapter_config.json").read_text())
    sd = load_file(str(folder / "adapter_model.safetensors"))
    out = {}
    for key, A in sd.items():
        if ".lora_A" not in key and ".lora_embedding_A" not in key:
            continue
        emb = ".lora_embedding_A" in key
        mod = key.removeprefix("base_model.model.").split(".lora_embedding_A" if emb else ".lora_A")[0]
        B = sd[key.replace("lora_embedding_A", "lora_embedding_B") if emb else key.replace("lora_A", "lora_B")]
        rp, ap = cfg.get("rank_pattern") or {}, cfg.get("alpha_pattern") or {}
        r = rp.get(get_pattern_key(rp.keys(), mod), cfg["r"])
        alpha = ap.get(get_pattern_key(ap.keys(), mod), cfg["lora_alpha"])
        scale = alpha / (r ** 0.5) if cfg.get("use_rslora") else alpha / r
        out[mod] = scale * (B.double() @ A.double())
    return out


@pytest.fixture
def dense_updates():
    """``{module: scale * B @ A}`` (float64, (out, in)) of a PEFT folder, read without vecmerge."""
    return _dense_updates


@pytest.fixture
def dense_expr():
    """``{module: sum_i c_i * dense update of folder i}`` for ``{folder name in ./: c_i}``."""
    def combine(coeffs: dict) -> dict:
        parts = [(c, _dense_updates(Path(name))) for name, c in coeffs.items()]
        return {m: sum(c * d[m] for c, d in parts) for m in parts[0][1]}

    return combine


@pytest.fixture(scope="session")
def peft_mu():
    """``peft.utils.merge_utils`` loaded from its file alone (it imports only torch), skipping peft's 4 s import."""
    import importlib.util

    spec = importlib.util.find_spec("peft")
    if spec is None or spec.origin is None:
        pytest.skip("peft is not installed")
    path = Path(spec.origin).parent / "utils" / "merge_utils.py"
    mod_spec = importlib.util.spec_from_file_location("_peft_merge_utils", path)
    mod = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(mod)
    return mod


SPLIT_DISAGREE = "model.layers.1.mlp.up_proj"  # the module where the ``split`` trajectory's two steps disagree


@pytest.fixture
def split(tmp_path, monkeypatch):
    """A toy trajectory (cwd) whose reference step disagrees in sign with the direction in ``SPLIT_DISAGREE``."""
    from vecmerge.testing import toy_trajectory

    root = tmp_path / "split"
    toy_trajectory(root, disagree=(SPLIT_DISAGREE,))
    monkeypatch.chdir(root)
    return root


def fro(d: dict) -> float:
    """The global Frobenius norm of ``{module: dense tensor}``."""
    return math.sqrt(sum(float((x**2).sum()) for x in d.values()))


os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# The factors in these tests are tiny: one thread is faster than two contending for two cores.
torch.set_num_threads(1)


def _mutation_tests(mutant: str) -> list[str] | None:
    """The test files (or node-id prefixes) that judge a mutant of its module: setup.cfg ``[mutmut:tests]``.

    ``mutant`` is mutmut's ``MUTANT_UNDER_TEST`` (``vecmerge.analysis.step.x_choose_step__mutmut_3``); None when no
    mutant is under test (mutmut's ``stats``/``fail`` runs, or a plain pytest run) or the module has no entry.
    """
    module = mutant.rpartition(".")[0]
    if not module.startswith("vecmerge."):
        return None
    import configparser

    cfg = configparser.ConfigParser()
    cfg.read(Path(__file__).parents[1] / "setup.cfg")
    picks = cfg.get("mutmut:tests", module, fallback=None)
    return picks.split() if picks else None


def pytest_collection_modifyitems(config, items):
    """``make mutate``: while mutmut tests a mutant, run only the tests setup.cfg names for its module."""
    picks = _mutation_tests(os.environ.get("MUTANT_UNDER_TEST", ""))
    if picks is None:
        return
    keep = [it for it in items if it.nodeid.startswith(tuple(picks))]
    if len(keep) < len(items):
        config.hook.pytest_deselected(items=[it for it in items if it not in keep])
        items[:] = keep
