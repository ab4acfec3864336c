"""The one shared toy-adapter factory: real PEFT folders, written by vecmerge.testing or by PEFT itself.

Fixtures:
    toy          a folder with v28, v51, v54e2, v54 (vecmerge.testing.toy_trajectory) and
                 vecmerge.yaml; the test runs with it as the current directory.
    tiny_base    a tiny random transformers Qwen3 saved to disk (session-wide).
    peft_adapter a factory: peft_adapter(name, **LoraConfig kwargs) saves a real PEFT adapter of
                 tiny_base with random (non-zero) A and B, and returns its folder.
    run_cli      runs the vecmerge CLI in-process: run_cli("project", "--base", ...) -> Result.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import pytest
import torch

from vecmerge.testing import toy_trajectory

QWEN3_TINY = dict(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=8, tie_word_embeddings=False,
                  max_position_embeddings=64)
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@pytest.fixture
def toy(tmp_path, monkeypatch):
    root = tmp_path / "toy"
    toy_trajectory(root)
    monkeypatch.chdir(root)
    return root


@pytest.fixture(scope="session")
def tiny_base(tmp_path_factory) -> Path:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    path = tmp_path_factory.mktemp("tiny_base")
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(Qwen3Config(**QWEN3_TINY))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def peft_adapter(tiny_base, tmp_path_factory):
    """Factory of real PEFT adapters on ``tiny_base``: random non-zero factors, any LoraConfig."""
    root = tmp_path_factory.mktemp("peft_adapters")
    made = {}

    def make(name: str, seed: int = 0, dtype=None, **lora_kwargs) -> Path:
        if name in made:
            return made[name]
        from peft import LoraConfig, get_peft_model
        from transformers import AutoModelForCausalLM

        kwargs = dict(r=4, lora_alpha=8, target_modules=list(TARGETS), init_lora_weights=False)
        kwargs.update(lora_kwargs)
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_pretrained(tiny_base)
        peft_model = get_peft_model(model, LoraConfig(**kwargs))
        if dtype is not None:
            peft_model = peft_model.to(dtype)
        out = root / name
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            peft_model.save_pretrained(out)
        cfg = json.loads((out / "adapter_config.json").read_text())
        cfg["base_model_name_or_path"] = str(tiny_base)
        (out / "adapter_config.json").write_text(json.dumps(cfg))
        made[name] = out
        return out

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


os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# The factors in these tests are tiny: one thread is faster than two contending for two cores.
torch.set_num_threads(1)
